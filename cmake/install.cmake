# `cmake --install build [--prefix P]`: what a worker built elsewhere needs.
#   bin/kvarenad, bin/kvarena                      the daemon and the CLI
#   lib/libkvarena_client.so                       the client: every library of this project
#                                                  it needs inside, gRPC / protobuf / xxhash
#                                                  linked from the system
#   include/kvarena/*.h                            its public headers (std + abseil only)
#   lib/cmake/kvarena/                             find_package(kvarena) -> kvarena::client
#   lib/pkgconfig/kvarena.pc                       pkg-config --cflags --libs kvarena
#   lib/python3.X/dist-packages/kvarena/           the Python module, where Debian's python3
#                                                  looks under /usr/local (python/CMakeLists.txt)
# tests/install/install_test.sh installs into a temporary prefix and builds a worker out of
# tree against it.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The installed client is one shared library around the static kvarena_client (whole, so
# every public symbol is in it) and what it links of this project.
add_library(kvarena_client_shared SHARED client/shared_library.cc)
kvarena_position_independent(kvarena_client)
target_link_libraries(kvarena_client_shared
  PRIVATE "$<LINK_LIBRARY:WHOLE_ARCHIVE,kvarena_client>"
  PUBLIC absl::status absl::statusor absl::time absl::synchronization)
target_include_directories(kvarena_client_shared INTERFACE
  $<BUILD_INTERFACE:${CMAKE_SOURCE_DIR}/client/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
set_target_properties(kvarena_client_shared PROPERTIES OUTPUT_NAME kvarena_client
  EXPORT_NAME client VERSION ${PROJECT_VERSION} SOVERSION 0)

install(TARGETS kvarenad kvarena RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS kvarena_client_shared EXPORT kvarenaTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY client/include/kvarena DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")
install(EXPORT kvarenaTargets NAMESPACE kvarena::
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvarena)
configure_package_config_file(cmake/kvarenaConfig.cmake.in
  ${CMAKE_BINARY_DIR}/kvarenaConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvarena)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/kvarenaConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/kvarenaConfig.cmake ${CMAKE_BINARY_DIR}/kvarenaConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvarena)
configure_file(cmake/kvarena.pc.in ${CMAKE_BINARY_DIR}/kvarena.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/kvarena.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

add_test(NAME install_test COMMAND ${CMAKE_SOURCE_DIR}/tests/install/install_test.sh
  ${CMAKE_BINARY_DIR} ${CMAKE_SOURCE_DIR}/tests/install/worker)
set_tests_properties(install_test PROPERTIES TIMEOUT 300)
