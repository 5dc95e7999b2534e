"""grpc_cpp_sources: the system protoc + grpc_cpp_plugin in a genrule (proto/CMakeLists.txt).

Bazel 4.2's own proto rules would need the protobuf and gRPC source trees; this runs the
Debian tools kvarena_system found, as the CMake build does.
"""

def grpc_cpp_sources(name, proto, stem):
    """Generates <stem>.pb.{h,cc} and <stem>.grpc.pb.{h,cc} in this package from proto.

    proto: the .proto label; its import root is its path minus "<stem>.proto".
    Returns the generated file names: [srcs], [hdrs].
    """
    srcs = [stem + ".pb.cc", stem + ".grpc.pb.cc"]
    hdrs = [stem + ".pb.h", stem + ".grpc.pb.h"]
    native.genrule(
        name = name,
        srcs = [proto],
        outs = srcs + hdrs,
        tools = [
            "@kvarena_system//:grpc_cpp_plugin",
            "@kvarena_system//:protoc",
        ],
        cmd = " ".join([
            "proto=$(location %s);" % proto,
            "$(location @kvarena_system//:protoc)",
            "--proto_path=$${proto%%/%s.proto}" % stem,
            "--cpp_out=$(RULEDIR)",
            "--grpc_out=$(RULEDIR)",
            "--plugin=protoc-gen-grpc=$(location @kvarena_system//:grpc_cpp_plugin)",
            "$$proto",
        ]),
        message = "protoc %s.proto" % stem,
    )
    return srcs, hdrs
