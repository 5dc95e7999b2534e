#include "arena/cuda/cuda_driver.h"

#include <mutex>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace kvarena::cuda_internal {
namespace {

absl::Status Classify(bool out_of_memory, bool unsupported, std::string message) {
  if (out_of_memory) return absl::ResourceExhaustedError(std::move(message));
  if (unsupported) return absl::FailedPreconditionError(std::move(message));
  return absl::InternalError(std::move(message));
}

// Looks `symbol` up at the ABI version its PFN type was declared for.
template <typename Fn>
absl::Status Load(const char* symbol, unsigned version, Fn* fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t err =
      cudaGetDriverEntryPointByVersion(symbol, &p, version, cudaEnableDefault, &found);
  if (err != cudaSuccess)
    return RuntimeStatus(absl::StrCat("cudaGetDriverEntryPointByVersion(", symbol, ")").c_str(),
                         err);
  if (found != cudaDriverEntryPointSuccess || p == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the CUDA driver has no ", symbol, " (ABI ", version,
        found == cudaDriverEntryPointVersionNotSufficent ? "): driver too old" : "): not found"));
  }
  *fn = reinterpret_cast<Fn>(p);
  return absl::OkStatus();
}

absl::Status LoadAll(DriverApi* api) {
  absl::Status s;
  auto load = [&](const char* symbol, unsigned version, auto* fn) {
    if (s.ok()) s = Load(symbol, version, fn);
  };
  load("cuGetErrorString", 6000, &api->GetErrorString);
  load("cuDeviceGet", 2000, &api->DeviceGet);
  load("cuDeviceGetAttribute", 2000, &api->DeviceGetAttribute);
  load("cuMemGetAllocationGranularity", 10020, &api->MemGetAllocationGranularity);
  load("cuMemAddressReserve", 10020, &api->MemAddressReserve);
  load("cuMemAddressFree", 10020, &api->MemAddressFree);
  load("cuMemCreate", 10020, &api->MemCreate);
  load("cuMemRelease", 10020, &api->MemRelease);
  load("cuMemMap", 10020, &api->MemMap);
  load("cuMemUnmap", 10020, &api->MemUnmap);
  load("cuMemSetAccess", 10020, &api->MemSetAccess);
  load("cuMemExportToShareableHandle", 10020, &api->MemExportToShareableHandle);
  load("cuMemImportFromShareableHandle", 10020, &api->MemImportFromShareableHandle);
  return s;
}

}  // namespace

absl::StatusOr<const DriverApi*> Driver() {
  static DriverApi api;
  static absl::Status status;
  static std::once_flag once;
  std::call_once(once, [] { status = LoadAll(&api); });
  KVARENA_RETURN_IF_ERROR(status);
  return &api;
}

absl::Status RuntimeStatus(const char* fn, cudaError_t err) {
  if (err == cudaSuccess) return absl::OkStatus();
  return Classify(err == cudaErrorMemoryAllocation,
                  err == cudaErrorNotSupported || err == cudaErrorNoDevice ||
                      err == cudaErrorInsufficientDriver,
                  absl::StrCat(fn, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
}

absl::Status DriverStatus(const char* fn, CUresult err) {
  if (err == CUDA_SUCCESS) return absl::OkStatus();
  const char* text = nullptr;
  if (auto api = Driver(); api.ok()) (*api)->GetErrorString(err, &text);
  return Classify(err == CUDA_ERROR_OUT_OF_MEMORY, err == CUDA_ERROR_NOT_SUPPORTED,
                  absl::StrCat(fn, ": CUresult ", int(err), ": ", text ? text : "unknown error"));
}

ScopedDevice::ScopedDevice(int device) : device_(device) {
  if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
  // Even when device_ is already the current device: on a new thread no context is
  // current until cudaSetDevice binds the primary one, and the driver calls need it.
  status_ = RuntimeStatus("cudaSetDevice", cudaSetDevice(device_));
}

ScopedDevice::~ScopedDevice() {
  if (status_.ok() && previous_ >= 0 && previous_ != device_) cudaSetDevice(previous_);
}

}  // namespace kvarena::cuda_internal
