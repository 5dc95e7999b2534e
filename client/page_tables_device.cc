// CopyToDevice (contract: kvarena/page_tables.h): the batch arrays into caller-owned
// device buffers. The CUDA runtime is used only where CMake found the toolkit
// (KVARENA_CLIENT_CUDA); elsewhere the copies fail with FAILED_PRECONDITION. CUDA errors
// become a status here, once.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvarena/page_tables.h"
#if defined(KVARENA_CLIENT_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace kvarena {
namespace {

// One host array and the device buffer it goes to.
struct Copy {
  const char* name;
  const void* host;
  int64_t count;
  size_t elem;
  void* device;
  int64_t capacity;
};

template <typename T>
Copy CopyOf(const char* name, const std::vector<T>& host, const DeviceBuffer<T>& dst) {
  return Copy{name, host.data(), int64_t(host.size()), sizeof(T), dst.data, dst.capacity};
}

#if defined(KVARENA_CLIENT_CUDA)

absl::Status CudaError(const char* op, const std::string& what, cudaError_t e) {
  return absl::InternalError(
      absl::StrCat(op, ": ", what, ": ", cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
}

// Checks every buffer before copying any, so a rejected call enqueues nothing.
absl::Status CopyAll(const char* op, const std::vector<Copy>& copies, CUstream_st* stream) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();  // clear it: no device is this call's answer, not a sticky error
    return absl::FailedPreconditionError(absl::StrCat(op, ": no CUDA device"));
  }
  for (const Copy& c : copies) {
    if (c.device == nullptr) continue;
    if (c.count > c.capacity) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": ", c.name, " has ", c.count, " elements but its buffer holds ", c.capacity));
    }
    cudaPointerAttributes attr{};
    if (cudaError_t e = cudaPointerGetAttributes(&attr, c.device); e != cudaSuccess) {
      return CudaError(op, absl::StrCat("cudaPointerGetAttributes(", c.name, ")"), e);
    }
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": the ", c.name, " buffer is not device memory"));
    }
  }
  for (const Copy& c : copies) {
    if (c.device == nullptr || c.count == 0) continue;
    const cudaError_t e =
        cudaMemcpyAsync(c.device, c.host, size_t(c.count) * c.elem, cudaMemcpyHostToDevice, stream);
    if (e != cudaSuccess) return CudaError(op, absl::StrCat("cudaMemcpyAsync(", c.name, ")"), e);
  }
  return absl::OkStatus();
}

#else

absl::Status CopyAll(const char* op, const std::vector<Copy>&, CUstream_st*) {
  return absl::FailedPreconditionError(
      absl::StrCat(op,
                   ": this client was built without CUDA; copy the host arrays yourself "
                   "or rebuild with the CUDA toolkit"));
}

#endif

}  // namespace

absl::Status CopyToDevice(const FlashInferPageTable& table, const FlashInferDeviceTable& dst,
                          CUstream_st* stream) {
  return CopyAll(
      "CopyToDevice(FlashInferPageTable)",
      {CopyOf("indptr", table.indptr, dst.indptr), CopyOf("indices", table.indices, dst.indices),
       CopyOf("last_page_len", table.last_page_len, dst.last_page_len)},
      stream);
}

absl::Status CopyToDevice(const VllmBlockTables& tables, const VllmDeviceTables& dst,
                          CUstream_st* stream) {
  return CopyAll("CopyToDevice(VllmBlockTables)",
                 {CopyOf("block_tables", tables.block_tables, dst.block_tables),
                  CopyOf("seq_lens", tables.seq_lens, dst.seq_lens),
                  CopyOf("query_start_loc", tables.query_start_loc, dst.query_start_loc),
                  CopyOf("slot_mapping", tables.slot_mapping, dst.slot_mapping)},
                 stream);
}

}  // namespace kvarena
