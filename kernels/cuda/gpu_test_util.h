// Test-only: device memory for the GPU tests (kv_kernels_cuda_test.cc,
// kv_kernels_cuda_quant_test.cc): a buffer freed on destruction, a HostBatch mirrored on
// the device, and the check that a device is present. Nothing touches CUDA before a test
// body calls it, so listing the tests works on any machine. Not thread-safe.
#ifndef KVARENA_KERNELS_CUDA_GPU_TEST_UTIL_H_
#define KVARENA_KERNELS_CUDA_GPU_TEST_UTIL_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/kv_kernels_cuda.h"
#include "kernels/cuda/test_problems.h"

namespace kvarena::gpu::testing {

inline bool GpuPresent() {
  static const bool present = [] {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  }();
  return present;
}

// Device memory, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    EXPECT_EQ(cudaMalloc(&p_, std::max<size_t>(bytes, 16)), cudaSuccess);
  }
  DeviceBuffer(const void* host, size_t bytes) : DeviceBuffer(bytes) {
    if (bytes > 0) {
      EXPECT_EQ(cudaMemcpy(p_, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  template <typename T = void>
  T* get() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }
  std::vector<uint8_t> Read(size_t bytes) const {
    std::vector<uint8_t> out(bytes);
    EXPECT_EQ(cudaMemcpy(out.data(), p_, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// A HostBatch mirrored on the device.
struct DeviceBatch {
  explicit DeviceBatch(HostBatch& hb)
      : pool(hb.pool().data(), hb.pool().size()),
        tables(hb.tables().data(), hb.tables().size() * sizeof(int32_t)),
        descs(hb.descs().data(), hb.descs().size() * sizeof(PagedSeqDesc)),
        k_scales(hb.k_scales().data(), hb.k_scales().size() * sizeof(float)),
        v_scales(hb.v_scales().data(), hb.v_scales().size() * sizeof(float)) {}
  PagedKvBatch Batch(const PageLayout& layout, int batch, int64_t max_span) const {
    PagedKvBatch b;
    b.layout = layout;
    b.pool_base = pool.get<uint8_t>();
    b.block_tables = tables.get<int32_t>();
    b.seqs = descs.get<PagedSeqDesc>();
    b.batch = batch;
    b.max_span = max_span;
    if (k_scales.bytes() > 0) b.k_scales = k_scales.get<float>();
    if (v_scales.bytes() > 0) b.v_scales = v_scales.get<float>();
    return b;
  }
  // Sequence b of hb as a view with device pool and block table.
  PagedKvView View(HostBatch& hb, int b) const {
    PagedKvView v = hb.View(b);
    v.pool_base = pool.get<uint8_t>();
    v.block_table = tables.get<int32_t>() + hb.descs()[b].table_offset;
    if (v.k_scales) v.k_scales = k_scales.get<float>();
    if (v.v_scales) v.v_scales = v_scales.get<float>();
    return v;
  }
  DeviceBuffer pool, tables, descs;
  DeviceBuffer k_scales, v_scales;  // fp8: hb's static scales
};

}  // namespace kvarena::gpu::testing

#define SKIP_WITHOUT_GPU() \
  if (!::kvarena::gpu::testing::GpuPresent()) GTEST_SKIP() << "no CUDA device"

#endif  // KVARENA_KERNELS_CUDA_GPU_TEST_UTIL_H_
