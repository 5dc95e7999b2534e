// Test-only: runs this directory's CUDA kernels as host C++ on machines without a GPU, so
// their indexing, masking, softmax and merge logic is checked everywhere (the GPU tests
// check the real thing where a GPU is lent).
//
// Each CTA runs as one fiber per thread on the calling OS thread (started with ucontext,
// switched with _setjmp / _longjmp), scheduled round-robin; __syncthreads() and
// __shfl_xor_sync() are cooperative barriers, so the kernels' own source runs unchanged. cp.async
// compiles to an immediate copy (cuda_util.cuh). Not covered: timing, memory-model and alignment
// faults, occupancy.
//
// Include this BEFORE any kernel header and after every other header: it defines the
// CUDA built-ins (threadIdx, __syncthreads, ...) as macros. Not thread-safe: one grid at
// a time per process.
#ifndef KVARENA_KERNELS_CUDA_EMULATOR_H_
#define KVARENA_KERNELS_CUDA_EMULATOR_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <setjmp.h>
#include <ucontext.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

namespace kvarena::emu {

// One CTA at a time, its threads as fibers.
class BlockRunner {
 public:
  static BlockRunner& Get();

  // Runs body() as every thread of block `block` (blockDim = dim), to completion.
  // Aborts with a message if the threads deadlock on a barrier.
  void Run(dim3 block, dim3 dim, const std::function<void()>& body);

  uint3 thread_idx() const { return fibers_[current_].tid; }
  uint3 block_idx() const { return block_; }
  dim3 block_dim() const { return dim_; }
  void SyncThreads() { Wait(block_barrier_, int(fibers_.size())); }
  float ShflXor(float v, int mask);

 private:
  struct Fiber {
    ucontext_t start;  // entry into Trampoline on the fiber's stack
    jmp_buf resume;    // where the fiber last yielded
    std::unique_ptr<char[]> stack;
    uint3 tid;
    bool started = false;
    bool done = false;
  };
  struct Barrier {
    int count = 0;
    int generation = 0;
  };
  static constexpr size_t kStackBytes = 256 << 10;

  static void Trampoline();
  // Runs fiber i until it yields or finishes.
  void SwitchTo(int i);
  void Wait(Barrier& b, int participants);
  void Yield() {
    if (_setjmp(fibers_[current_].resume) == 0) _longjmp(main_, 1);
  }

  std::vector<Fiber> fibers_;
  jmp_buf main_;  // the scheduler, in Run()
  int current_ = 0;
  bool progress_ = false;
  uint3 block_{};
  dim3 dim_;
  const std::function<void()>* body_ = nullptr;
  Barrier block_barrier_;
  std::vector<Barrier> warp_barriers_;
  std::vector<float> lanes_;   // [2][threads] shuffle slots, alternating between shuffles
  std::vector<int> shuffles_;  // [threads] shuffles each thread has done
};

inline uint3 ThreadIdx() { return BlockRunner::Get().thread_idx(); }
inline uint3 BlockIdx() { return BlockRunner::Get().block_idx(); }
inline dim3 BlockDim() { return BlockRunner::Get().block_dim(); }
inline void SyncThreads() { BlockRunner::Get().SyncThreads(); }
inline float ShflXor(float v, int mask) { return BlockRunner::Get().ShflXor(v, mask); }

// Runs kernel() for every block of `grid` with blockDim `block`. Before each block the
// dynamic shared memory (`smem`, `smem_bytes`) is filled with 0xFF (NaN in every float
// type), so reading an unwritten slot shows up.
void LaunchGrid(dim3 grid, dim3 block, void* smem, size_t smem_bytes,
                const std::function<void()>& kernel);

}  // namespace kvarena::emu

#define threadIdx (::kvarena::emu::ThreadIdx())
#define blockIdx (::kvarena::emu::BlockIdx())
#define blockDim (::kvarena::emu::BlockDim())
#define __syncthreads() ::kvarena::emu::SyncThreads()
#define __shfl_xor_sync(mask, v, o) ::kvarena::emu::ShflXor((v), (o))
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
#undef __shared__
#define __shared__

#endif  // KVARENA_KERNELS_CUDA_EMULATOR_H_
