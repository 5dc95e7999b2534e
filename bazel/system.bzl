"""kvarena_system: the Debian system libraries and tools as a Bazel repository.

Nothing is downloaded. At fetch time this rule asks pkg-config for the exact flags of each
library the CMake build links (find_package there, and xxhash and hiredis by name), links protoc, grpc_cpp_plugin and the
health proto from Debian's packages, and looks for nvcc the way the top-level
CMakeLists.txt does. It writes:

  @kvarena_system//:<lib>       cc_library per system library (defines + linkopts only:
                                 the headers are in /usr/include, the compiler's own path)
  @kvarena_system//:protoc, :grpc_cpp_plugin, :health_proto
  @kvarena_system//cuda:cudart  the CUDA runtime (headers + -lcudart) when nvcc was found,
                                 else a header whose genrule fails with the reason
  @kvarena_system//:defs.bzl    HAVE_CUDA, NVCC, OPENSSL and if_cuda()

Environment (pass with --repo_env=NAME=VALUE; a change re-runs the rule):
  KVARENA_CUDA=OFF              build without CUDA even where nvcc is installed (as
                                 cmake -DKVARENA_CUDA=OFF); --config=nocuda sets it
  NVCC                          the nvcc to use (else /usr/local/cuda/bin/nvcc, else PATH)
  KVARENA_HEALTH_PROTO_DIR      where grpc/health/v1/health.proto lives (/usr/share/grpc-proto)
  PKG_CONFIG_PATH               as for pkg-config
"""

# Bazel target -> pkg-config modules, extra linkopts, deps. Mirrors the imported targets
# the CMakeLists.txt files link (absl::status, gRPC::grpc++, GTest::gmock, ...).
_LIBS = {
    "threads": ([], ["-pthread"], []),
    "absl_btree": (["absl_btree"], [], []),
    "absl_cleanup": (["absl_cleanup"], [], []),
    "absl_flags": (["absl_flags"], [], []),
    "absl_flags_parse": (["absl_flags_parse"], [], []),
    "absl_flags_usage": (["absl_flags_usage"], [], []),
    "absl_flat_hash_map": (["absl_flat_hash_map"], [], []),
    "absl_flat_hash_set": (["absl_flat_hash_set"], [], []),
    "absl_span": (["absl_span"], [], []),
    "absl_status": (["absl_status"], [], []),
    "absl_statusor": (["absl_statusor"], [], []),
    "absl_str_format": (["absl_str_format"], [], []),
    "absl_strings": (["absl_strings"], [], []),
    "absl_synchronization": (["absl_synchronization"], [], []),
    "absl_time": (["absl_time"], [], []),
    "protobuf": (["protobuf"], [], []),
    "xxhash": (["libxxhash"], [], []),
    # the Redis tier's client (tiers/redis): Debian's hiredis 0.14
    "hiredis": (["hiredis"], [], []),
    "grpc++": (["grpc++"], [], [":protobuf"]),
    # Debian ships no grpc++_reflection.pc: the library as gRPCTargets.cmake names it.
    "grpc++_reflection": ([], ["-lgrpc++_reflection"], [":grpc++"]),
    "prometheus_core": (["prometheus-cpp-core"], [], []),
    "prometheus_pull": (["prometheus-cpp-pull"], [], [":prometheus_core"]),
    "gtest": (["gtest"], [], []),
    "gtest_main": (["gtest_main"], [], [":gtest"]),
    "gmock": (["gmock"], [], [":gtest"]),
}

_OFF = ["0", "off", "no", "false"]

def _fail_setup(what):
    fail("kvarena_system: %s (run scripts/setup-deps)" % what)

def _pkg_config(rctx, pkg_config, flag, modules):
    result = rctx.execute([pkg_config, flag] + modules)
    if result.return_code != 0:
        _fail_setup("pkg-config %s %s failed: %s" % (flag, " ".join(modules), result.stderr.strip()))
    return [f for f in result.stdout.strip().split(" ") if f]

def _lib_rule(name, pkg_config, rctx):
    modules, extra, deps = _LIBS[name]
    defines, copts, linkopts = [], [], []
    if modules:
        for f in _pkg_config(rctx, pkg_config, "--cflags", modules):
            if f.startswith("-D"):
                defines.append(f[2:])
            elif not f.startswith("-I"):  # /usr/include is the compiler's own
                copts.append(f)
        linkopts = _pkg_config(rctx, pkg_config, "--libs", modules)
    return """cc_library(
    name = {name},
    defines = {defines},
    copts = {copts},
    linkopts = {linkopts},
    deps = {deps},
)
""".format(
        name = repr(name),
        defines = repr(defines),
        copts = repr(copts),
        linkopts = repr(linkopts + extra),
        deps = repr(deps),
    )

def _tool(rctx, name, env_name = None):
    path = rctx.os.environ.get(env_name) if env_name else None
    if not path:
        path = rctx.which(name)
    if not path:
        _fail_setup("no %s on PATH" % name)
    rctx.symlink(path, "bin/" + name)

def _find_nvcc(rctx):
    """As the top-level CMakeLists.txt: KVARENA_CUDA off wins; else nvcc at /usr/local/cuda
    or on PATH. Returns the CUDA home (the directory above nvcc's bin/), or None."""
    if rctx.os.environ.get("KVARENA_CUDA", "on").lower() in _OFF:
        return None
    nvcc = rctx.os.environ.get("NVCC")
    if not nvcc and rctx.path("/usr/local/cuda/bin/nvcc").exists:
        nvcc = "/usr/local/cuda/bin/nvcc"
    if not nvcc:
        nvcc = rctx.which("nvcc")
    if not nvcc:
        return None
    home = rctx.path(str(nvcc)).realpath.dirname.dirname
    if not home.get_child("include").get_child("cuda_runtime.h").exists:
        print("kvarena_system: %s has no include/cuda_runtime.h; building without CUDA" % home)
        return None
    return home

def _cuda_build(home):
    if home == None:
        # No toolkit: the CUDA targets are tagged manual (so //... skips them); asked for
        # by name, they fail on this header with the reason.
        return """package(default_visibility = ["//visibility:public"])

genrule(
    name = "no_cuda_toolkit",
    outs = ["no_cuda_toolkit.h"],
    cmd = "echo 'kvarena_system found no CUDA toolkit (nvcc), or KVARENA_CUDA is off' >&2; exit 1",
)

cc_library(
    name = "cudart",
    hdrs = ["no_cuda_toolkit.h"],
)
"""
    return """package(default_visibility = ["//visibility:public"])

# The runtime's headers that the .cc files include (cuda_runtime*.h, cuda_bf16/fp16 and
# what they pull in), declared so sandboxed compiles see them; linked as a shared library
# (CMAKE_CUDA_RUNTIME_LIBRARY Shared), found at run time through the rpath.
cc_library(
    name = "cudart",
    hdrs = glob(["include/*.h", "include/*.hpp", "include/crt/**", "include/nv/**"]),
    includes = ["include"],
    linkopts = ["-L{lib}", "-Wl,-rpath,{lib}", "-lcudart"],
)
""".format(lib = str(home.get_child("lib64")))

def _kvarena_system_impl(rctx):
    pkg_config = rctx.which("pkg-config")
    if not pkg_config:
        _fail_setup("no pkg-config")
    libs = [_lib_rule(name, pkg_config, rctx) for name in _LIBS]

    _tool(rctx, "protoc")
    _tool(rctx, "grpc_cpp_plugin")
    health_dir = rctx.os.environ.get("KVARENA_HEALTH_PROTO_DIR", "/usr/share/grpc-proto")
    health = rctx.path(health_dir + "/grpc/health/v1/health.proto")
    if not health.exists:
        _fail_setup("no %s (Debian's grpc-proto)" % health)
    rctx.symlink(health, "grpc_proto/grpc/health/v1/health.proto")

    rctx.file("WORKSPACE", "workspace(name = \"kvarena_system\")\n")
    rctx.file("BUILD.bazel", """# Generated by //bazel:system.bzl from pkg-config: do not edit.
package(default_visibility = ["//visibility:public"])

exports_files(["defs.bzl"])

alias(name = "protoc", actual = "bin/protoc")

alias(name = "grpc_cpp_plugin", actual = "bin/grpc_cpp_plugin")

alias(name = "health_proto", actual = "grpc_proto/grpc/health/v1/health.proto")

""" + "\n".join(libs))

    home = _find_nvcc(rctx)
    if home != None:
        rctx.symlink(home.get_child("include"), "cuda/include")
    rctx.file("cuda/BUILD.bazel", _cuda_build(home))
    openssl = rctx.which("openssl")
    rctx.file("defs.bzl", '''"""Generated by //bazel:system.bzl: what kvarena_system found."""

# The openssl command the TLS tests make certificates with (they skip where it is missing).
OPENSSL = "{openssl}"

# True where nvcc was found (and KVARENA_CUDA is not off): the CUDA backend is built.
HAVE_CUDA = {have}

# The nvcc the kernels are compiled with ("" without CUDA).
NVCC = "{nvcc}"

def if_cuda(if_true, if_false = []):
    """if_true where the CUDA backend is built, else if_false."""
    return if_true if HAVE_CUDA else if_false
'''.format(
        openssl = str(openssl) if openssl else "/usr/bin/openssl",
        have = home != None,
        nvcc = str(home.get_child("bin").get_child("nvcc")) if home != None else "",
    ))

kvarena_system = repository_rule(
    implementation = _kvarena_system_impl,
    local = True,
    environ = ["KVARENA_CUDA", "NVCC", "KVARENA_HEALTH_PROTO_DIR", "PKG_CONFIG_PATH", "PATH"],
)
