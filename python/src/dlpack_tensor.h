// Tensors across the Python boundary, through the DLPack protocol (Debian's dlpack 0.6
// header) and the buffer protocol, with no framework linked.
//
// In: ParseTensor borrows any object with __dlpack__ (torch, numpy, a kvarena.Tensor) or
// the buffer protocol as a TensorArg: host memory, C-contiguous, float32 / float16 /
// bfloat16. The InTensor keeps the producer's capsule (or buffer) alive until it is
// destroyed, so the TensorArg's data stays valid for the call it is passed to. A tensor
// the library writes (Access::kWrite: DecodeBatch.run's out) must be writable memory as
// its producer says: numpy's flags.writeable, the buffer protocol's readonly (a read-only
// memmap, a view of bytes). DLPack 0.6 carries no read-only flag, so a torch tensor is
// taken as writable (torch warns when it wraps read-only memory).
//
// Out: Tensor (kvarena.Tensor in Python) is a typed view of memory kept alive by `owner`
// (a shared_ptr: the reply bytes of a call, or the cache handle whose client maps the
// pool). __dlpack__ hands each consumer a capsule whose deleter holds its own reference
// to the owner, so a torch tensor made from it keeps the memory alive after the Tensor,
// the Cache and the Client are gone. Like(input, t) returns t as the input's library's
// type (torch in, torch out; numpy in, numpy out).
//
// Thread-safety: Tensor is immutable after construction; the capsule deleter touches no
// Python object and may run without the GIL.
#ifndef KVARENA_PYTHON_SRC_DLPACK_TENSOR_H_
#define KVARENA_PYTHON_SRC_DLPACK_TENSOR_H_

#include <dlpack/dlpack.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvarena/paged_kv.h"
#include "kvarena/types.h"

namespace kvarena::python {

struct InTensor {
  TensorArg arg;
  pybind11::object keep;  // the DLPack capsule or buffer the data belongs to
};

// Whether the library only reads a tensor or also writes into it.
enum class Access { kRead, kWrite };

// `name` labels errors ("k", "q", ...). Raises InvalidArgument (nothing sent) for an
// object with neither protocol, device memory, a non-contiguous or unsupported-dtype
// tensor, and, for kWrite, read-only memory.
InTensor ParseTensor(pybind11::handle obj, const char* name, Access access = Access::kRead);

struct Tensor {
  std::shared_ptr<const void> owner;  // keeps data alive
  void* data = nullptr;
  DLDataType dtype{};
  DLDevice device{kDLCPU, 0};
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // elements; empty: C-contiguous

  int64_t numel() const;
  size_t nbytes() const { return size_t(numel()) * (dtype.bits / 8) * dtype.lanes; }
};

DLDataType ToDLDataType(DType t);
// The type of one stored value of a KV format (int8 for int8: its scales are bytes of the
// same rows, kvarena/paged_kv.h).
DLDataType ToDLDataType(KvFormat f);
// A Tensor owning the bytes of a reply tensor.
Tensor FromTensorOut(TensorOut out);
// A 1-D or 2-D tensor owning a copy of int32 / int64 values.
Tensor FromVector(std::vector<int32_t> v, std::vector<int64_t> shape);
Tensor FromVector(std::vector<int64_t> v, std::vector<int64_t> shape);
// A new C-contiguous tensor of `shape` and `dtype`, zero-filled.
Tensor NewTensor(DType dtype, std::vector<int64_t> shape);

// t as the type of `like`'s library when that library can take it (torch.from_dlpack,
// numpy.from_dlpack); else the kvarena.Tensor itself.
pybind11::object Like(pybind11::handle like, Tensor t);

void BindTensor(pybind11::module_& m);

}  // namespace kvarena::python

#endif  // KVARENA_PYTHON_SRC_DLPACK_TENSOR_H_
