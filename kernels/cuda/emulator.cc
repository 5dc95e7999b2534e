// Test-only fiber scheduler behind emulator.h.
//
// Fibers jump between stacks with _longjmp, which glibc's fortified longjmp would reject.
#undef _FORTIFY_SOURCE
#include "kernels/cuda/emulator.h"

#include <cstdio>
#include <cstdlib>

namespace kvarena::emu {

BlockRunner& BlockRunner::Get() {
  static BlockRunner* runner = new BlockRunner;
  return *runner;
}

void BlockRunner::Trampoline() {
  BlockRunner& r = Get();
  (*r.body_)();
  r.fibers_[r.current_].done = true;
  r.progress_ = true;
  _longjmp(r.main_, 1);  // never returns: the fiber's stack is abandoned
}

void BlockRunner::Run(dim3 block, dim3 dim, const std::function<void()>& body) {
  const int threads = int(dim.x * dim.y * dim.z);
  if (threads % 32 != 0) {
    std::fprintf(stderr, "emulator: block of %d threads is not whole warps\n", threads);
    std::abort();
  }
  block_ = uint3{block.x, block.y, block.z};
  dim_ = dim;
  body_ = &body;
  block_barrier_ = Barrier{};
  warp_barriers_.assign(size_t(threads / 32), Barrier{});
  lanes_.assign(2 * size_t(threads), 0.0f);
  shuffles_.assign(size_t(threads), 0);
  if (fibers_.size() != size_t(threads)) {
    fibers_.clear();
    fibers_.resize(size_t(threads));
    for (Fiber& f : fibers_) f.stack.reset(new char[kStackBytes]);
  }
  for (int i = 0; i < threads; ++i) {
    Fiber& f = fibers_[i];
    f.tid = uint3{unsigned(i) % dim.x, unsigned(i) / dim.x % dim.y, unsigned(i) / (dim.x * dim.y)};
    f.started = false;
    f.done = false;
    getcontext(&f.start);
    f.start.uc_stack.ss_sp = f.stack.get();
    f.start.uc_stack.ss_size = kStackBytes;
    f.start.uc_link = nullptr;
    makecontext(&f.start, &BlockRunner::Trampoline, 0);
  }
  int live = threads;
  while (live > 0) {
    progress_ = false;
    for (int i = 0; i < threads; ++i) {
      if (fibers_[i].done) continue;
      SwitchTo(i);
      if (fibers_[i].done) --live;
    }
    if (live > 0 && !progress_) {
      std::fprintf(stderr, "emulator: block (%u,%u,%u) deadlocked on a barrier\n", block.x, block.y,
                   block.z);
      std::abort();
    }
  }
}

void BlockRunner::SwitchTo(int i) {
  current_ = i;
  if (_setjmp(main_) != 0) return;  // fiber i yielded or finished
  Fiber& f = fibers_[size_t(i)];
  if (!f.started) {
    f.started = true;
    progress_ = true;
    setcontext(&f.start);
  }
  _longjmp(f.resume, 1);
}

void BlockRunner::Wait(Barrier& b, int participants) {
  const int generation = b.generation;
  if (++b.count == participants) {
    b.count = 0;
    ++b.generation;
    progress_ = true;
    return;
  }
  while (b.generation == generation) Yield();
}

float BlockRunner::ShflXor(float v, int mask) {
  const int tid = int(thread_idx().x + dim_.x * (thread_idx().y + dim_.y * thread_idx().z));
  const int warp = tid / 32, lane = tid % 32;
  // Alternate slot sets: a lane can only write this set again two shuffles later, after
  // the next barrier, which every lane passes only once it has read this shuffle.
  float* slots = lanes_.data() + size_t(shuffles_[size_t(tid)]++ % 2) * dim_.x * dim_.y * dim_.z;
  slots[tid] = v;
  Wait(warp_barriers_[size_t(warp)], 32);
  return slots[warp * 32 + (lane ^ mask)];
}

void LaunchGrid(dim3 grid, dim3 block, void* smem, size_t smem_bytes,
                const std::function<void()>& kernel) {
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        if (smem_bytes > 0) std::memset(smem, 0xFF, smem_bytes);
        BlockRunner::Get().Run(dim3(x, y, z), block, kernel);
      }
    }
  }
}

}  // namespace kvarena::emu
