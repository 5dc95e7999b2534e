// KvKernels over the CUDA kernels (contract: cuda_kv_kernels.h). A Call holds one
// request's stream and stream-ordered device buffers; it turns the first CUDA error into
// the call's status and always synchronises and frees before returning.
#include "kernels/cuda/cuda_kv_kernels.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kernels/cuda/kv_kernels_cuda.h"

namespace kvarena {
namespace {

class CudaKvKernels;

// One kernel call: device `device` current, a stream, buffers freed at the end.
class Call {
 public:
  Call(CudaKvKernels* owner, const char* name);
  ~Call();
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  cudaStream_t stream() const { return stream_; }
  // Records the first failure; returns whether all went well so far.
  bool Check(cudaError_t e, const char* fn) {
    if (e != cudaSuccess && status_.ok()) {
      status_ = absl::InternalError(absl::StrCat("cuda ", name_, ": ", fn, ": ",
                                                 cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
    }
    return status_.ok();
  }
  // Device buffer of `bytes` (256-byte aligned), holding a copy of `host` when given.
  void* Alloc(size_t bytes, const void* host = nullptr) {
    void* p = nullptr;
    if (!status_.ok() ||
        !Check(cudaMallocAsync(&p, bytes == 0 ? 16 : bytes, stream_), "cudaMallocAsync")) {
      return nullptr;
    }
    buffers_.push_back(p);
    if (host && bytes)
      Check(cudaMemcpyAsync(p, host, bytes, cudaMemcpyHostToDevice, stream_),
            "cudaMemcpyAsync(H2D)");
    return p;
  }
  void CopyOut(void* host, const void* dev, size_t bytes) {
    if (status_.ok() && bytes) {
      Check(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, stream_),
            "cudaMemcpyAsync(D2H)");
    }
  }
  // The view with its block table and static scales (host arrays in core's views)
  // staged to the device.
  PagedKvView DeviceView(const PagedKvView& view) {
    PagedKvView d = view;
    d.block_table = static_cast<const int32_t*>(
        Alloc(size_t(view.num_blocks) * sizeof(int32_t), view.block_table));
    const size_t scales = size_t(view.layout.num_kv_heads) * sizeof(float);
    if (view.k_scales) d.k_scales = static_cast<const float*>(Alloc(scales, view.k_scales));
    if (view.v_scales) d.v_scales = static_cast<const float*>(Alloc(scales, view.v_scales));
    return d;
  }
  // Waits for the stream, frees the buffers; the call's status.
  absl::Status Finish();

 private:
  CudaKvKernels* const owner_;
  const char* const name_;
  int previous_device_ = -1;
  cudaStream_t stream_ = nullptr;
  std::vector<void*> buffers_;
  absl::Status status_;
  bool finished_ = false;
};

class CudaKvKernels final : public KvKernels {
 public:
  explicit CudaKvKernels(int device) : device_(device) {}
  ~CudaKvKernels() override {
    cudaSetDevice(device_);
    for (cudaStream_t s : streams_) cudaStreamDestroy(s);
  }
  std::string name() const override { return "cuda"; }
  absl::Status CheckLayout(const PageLayout& layout) const override {
    if (absl::Status s = CheckKvFormat(name(), layout, {KvFormat::kInt8, KvFormat::kFp8E4M3});
        !s.ok()) {
      return s;
    }
    if (layout.head_dim == 64 || layout.head_dim == 128 || layout.head_dim == 256)
      return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("spec.head_dim=", layout.head_dim,
                                                   " but the CUDA kernels take 64, 128 or 256"));
  }
  int device() const { return device_; }
  // Kernels index positions in 32 bits (kv_kernels_cuda.h).
  KernelLimits limits() const override { return KernelLimits{(int64_t{1} << 31) - 1, 64}; }

  absl::Status ClearPages(const PageLayout& layout, uint8_t* pool_base, const int32_t* ids,
                          int64_t n) override {
    Call call(this, "ClearPages");
    const size_t page = layout.PageBytes();
    for (int64_t i = 0; i < n;) {  // one memset per run of consecutive ids
      int64_t j = i + 1;
      while (j < n && ids[j] == ids[j - 1] + 1) ++j;
      if (!call.Check(cudaMemsetAsync(pool_base + size_t(ids[i]) * page, 0, size_t(j - i) * page,
                                      call.stream()),
                      "cudaMemsetAsync")) {
        break;
      }
      i = j;
    }
    return call.Finish();
  }

  absl::Status CopyPages(const PageLayout& layout, uint8_t* pool_base, const PageCopy* copies,
                         int64_t n) override {
    Call call(this, "CopyPages");
    ForEachCopyPart(
        layout, pool_base, copies, n,
        [&call](uint8_t* dst, const uint8_t* src, size_t kept, size_t rest) {
          return (kept == 0 || call.Check(cudaMemcpyAsync(dst, src, kept, cudaMemcpyDeviceToDevice,
                                                          call.stream()),
                                          "cudaMemcpyAsync(D2D)")) &&
                 (rest == 0 || call.Check(cudaMemsetAsync(dst + kept, 0, rest, call.stream()),
                                          "cudaMemsetAsync"));
        });
    return call.Finish();
  }

  // The tiers' copies: one cudaMemcpyAsync per run of consecutive page ids, on the call's
  // own stream (never a caller's), synchronised before returning.
  absl::Status ReadPages(const PageLayout& layout, const uint8_t* pool_base, const int32_t* ids,
                         int64_t n, uint8_t* out) override {
    return CopyPageRuns(layout, ids, n, "ReadPages", [&](int64_t i, size_t bytes, cudaStream_t s) {
      const size_t page = layout.PageBytes();
      return cudaMemcpyAsync(out + size_t(i) * page, pool_base + size_t(ids[i]) * page, bytes,
                             cudaMemcpyDeviceToHost, s);
    });
  }

  absl::Status WritePages(const PageLayout& layout, uint8_t* pool_base, const int32_t* ids,
                          int64_t n, const uint8_t* in) override {
    return CopyPageRuns(layout, ids, n, "WritePages", [&](int64_t i, size_t bytes, cudaStream_t s) {
      const size_t page = layout.PageBytes();
      return cudaMemcpyAsync(pool_base + size_t(ids[i]) * page, in + size_t(i) * page, bytes,
                             cudaMemcpyHostToDevice, s);
    });
  }

  // copy(i, bytes, stream) for each run [i, j) of consecutive ids.
  template <typename Copy>
  absl::Status CopyPageRuns(const PageLayout& layout, const int32_t* ids, int64_t n,
                            const char* name, Copy copy) {
    Call call(this, name);
    for (int64_t i = 0; i < n;) {
      int64_t j = i + 1;
      while (j < n && ids[j] == ids[j - 1] + 1) ++j;
      if (!call.Check(copy(i, size_t(j - i) * layout.PageBytes(), call.stream()),
                      "cudaMemcpyAsync"))
        break;
      i = j;
    }
    return call.Finish();
  }

  absl::Status AppendKv(const PagedKvView& view, int64_t pos, int64_t n, const void* k,
                        const void* v) override {
    Call call(this, "AppendKv");
    const size_t bytes = TensorBytes(view.layout, view.layout.num_kv_heads, n);
    const PagedKvView d = call.DeviceView(view);
    void* dk = call.Alloc(bytes, k);
    void* dv = call.Alloc(bytes, v);
    if (dv) call.Check(gpu::AppendKv(d, pos, n, dk, dv, call.stream()), "AppendKv");
    return call.Finish();
  }

  absl::Status GatherKv(const PagedKvView& view, int64_t pos, int64_t n, void* k_out,
                        void* v_out) override {
    Call call(this, "GatherKv");
    const size_t bytes = TensorBytes(view.layout, view.layout.num_kv_heads, n);
    const PagedKvView d = call.DeviceView(view);
    void* dk = call.Alloc(bytes);
    void* dv = call.Alloc(bytes);
    if (dv && call.Check(gpu::GatherKv(d, pos, n, dk, dv, call.stream()), "GatherKv")) {
      call.CopyOut(k_out, dk, bytes);
      call.CopyOut(v_out, dv, bytes);
    }
    return call.Finish();
  }

  absl::Status PagedAttention(const PagedKvView& view, const AttentionParams& params, const void* q,
                              void* out) override {
    Call call(this, "PagedAttention");
    const size_t bytes = TensorBytes(view.layout, params.num_q_heads, params.n);
    const PagedKvView d = call.DeviceView(view);
    size_t ws_bytes = 0;
    call.Check(gpu::PagedAttentionWorkspaceSize(d, params, &ws_bytes),
               "PagedAttentionWorkspaceSize");
    void* dq = call.Alloc(bytes, q);
    void* dout = call.Alloc(bytes);
    void* ws = call.Alloc(ws_bytes);
    if (ws && call.Check(gpu::PagedAttention(d, params, dq, dout, ws, ws_bytes, call.stream()),
                         "PagedAttention")) {
      call.CopyOut(out, dout, bytes);
    }
    return call.Finish();
  }

  // A stream for one call; streams are reused, never shared by two calls at once.
  cudaError_t AcquireStream(cudaStream_t* s) {
    {
      absl::MutexLock lock(&mu_);
      if (!free_.empty()) {
        *s = free_.back();
        free_.pop_back();
        return cudaSuccess;
      }
    }
    const cudaError_t e = cudaStreamCreateWithFlags(s, cudaStreamNonBlocking);
    if (e == cudaSuccess) {
      absl::MutexLock lock(&mu_);
      streams_.push_back(*s);
    }
    return e;
  }
  void ReleaseStream(cudaStream_t s) {
    absl::MutexLock lock(&mu_);
    free_.push_back(s);
  }

 private:
  static size_t TensorBytes(const PageLayout& l, int heads, int64_t n) {
    return size_t(heads) * size_t(n) * size_t(l.head_dim) * l.ActivationBytes();
  }

  const int device_;
  absl::Mutex mu_;
  std::vector<cudaStream_t> streams_ ABSL_GUARDED_BY(mu_);  // all, destroyed with us
  std::vector<cudaStream_t> free_ ABSL_GUARDED_BY(mu_);
};

Call::Call(CudaKvKernels* owner, const char* name) : owner_(owner), name_(name) {
  if (cudaGetDevice(&previous_device_) != cudaSuccess) previous_device_ = -1;
  if (Check(cudaSetDevice(owner_->device()), "cudaSetDevice")) {
    Check(owner_->AcquireStream(&stream_), "cudaStreamCreate");
  }
}

absl::Status Call::Finish() {
  if (stream_) {
    for (void* p : buffers_) Check(cudaFreeAsync(p, stream_), "cudaFreeAsync");
    Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    owner_->ReleaseStream(stream_);
  }
  buffers_.clear();
  stream_ = nullptr;
  if (previous_device_ >= 0 && previous_device_ != owner_->device())
    cudaSetDevice(previous_device_);
  finished_ = true;
  return status_;
}

Call::~Call() {
  if (!finished_) Finish().IgnoreError();  // every path calls Finish; this is the backstop
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvKernels>> NewCudaKvKernels(int device) {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
    cudaGetLastError();  // clear the error a driverless machine leaves behind
    return absl::FailedPreconditionError(
        absl::StrCat("cuda kernels: no usable CUDA device (cudaGetDeviceCount: ",
                     e == cudaSuccess ? "0 devices" : cudaGetErrorString(e), ")"));
  }
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda kernels: device ", device, " out of range; this machine has ", count));
  }
  // Calls allocate their staging buffers from the device's default stream-ordered pool:
  // keep up to 256 MiB of it cached between calls instead of unmapping it at every sync.
  cudaMemPool_t pool;
  if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
    uint64_t keep = uint64_t{256} << 20;
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
  }
  cudaGetLastError();
  return std::make_unique<CudaKvKernels>(device);
}

}  // namespace kvarena
