"""cuda_objects: .cu files compiled by nvcc in a genrule (Bazel 4.2 has no CUDA rules).

Flags mirror the CMake build: C++17 (CMake 3.25 knows no nvcc flag for CUDA 20),
-lineinfo, sm_90 code plus compute_90 PTX (CMAKE_CUDA_ARCHITECTURES 90-real 90-virtual),
-O2 -DNDEBUG (RelWithDebInfo without -g, as Bazel's -c opt), and -fPIC since every object
of this build is PIC (--force_pic in .bazelrc). Where kvarena_system found no nvcc the
rules are tagged manual, so //... skips them, and fail with a message when asked for.
"""

load("@kvarena_system//:defs.bzl", "HAVE_CUDA", "NVCC")

CUDA_TAGS = [] if HAVE_CUDA else ["manual"]

_NVCC_FLAGS = " ".join([
    "-std=c++17",
    "-O2",
    "-DNDEBUG",
    "-lineinfo",
    "--generate-code=arch=compute_90,code=[compute_90,sm_90]",
    "-Xcompiler=-fPIC",
    "-I.",
    "-Iclient/include",
])

def cuda_objects(name, srcs, hdrs):
    """One object file per .cu in srcs (name_objs/<stem>.o); returns their labels.

    hdrs: every header the .cu files include (transitively), so the sandbox holds them.
    """
    objs = []
    for src in srcs:
        stem = src.rsplit("/", 1)[-1][:-len(".cu")]
        obj = "%s_objs/%s.o" % (name, stem)
        if HAVE_CUDA:
            cmd = "%s %s -c $(location %s) -o $@" % (NVCC, _NVCC_FLAGS, src)
        else:
            cmd = "echo 'no CUDA toolkit (nvcc) was found when kvarena_system was set up' >&2; exit 1"
        native.genrule(
            name = "%s_%s" % (name, stem),
            srcs = [src] + hdrs,
            outs = [obj],
            cmd = cmd,
            message = "nvcc %s" % src,
            tags = CUDA_TAGS,
        )
        objs.append(obj)
    return objs
