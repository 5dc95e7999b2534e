// TilePrefetcher: prefetches the next tile's K and V of one head into L2 a few tokens at
// a time, so the requests spread over the computation instead of stalling it in one
// burst. (The hardware prefetchers do not follow the per-head walk: one head's bytes
// every TokenBytes.) Not thread-safe; one per tile step.
//
// Shared by the vectorised tile units, each built with its own instruction-set flags:
// everything here has internal linkage (an unnamed namespace), so every unit keeps its
// own copy and the linker never hands one unit's code to another.
#ifndef KVARENA_KERNELS_CPU_TILE_PREFETCHER_H_
#define KVARENA_KERNELS_CPU_TILE_PREFETCHER_H_

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/attention_tile.h"

namespace kvarena::cpu_internal {
namespace {  // NOLINT(build/namespaces): internal linkage on purpose, see above

class TilePrefetcher {
 public:
  TilePrefetcher(const AttendTileArgs& args, size_t head_bytes)
      : k_(args.next_k),
        v_(args.next_v),
        n_(args.next_tokens),
        off_(args.head_offset),
        bytes_(head_bytes) {}

  // Prefetches the next `tokens` tokens not yet prefetched.
  void Step(int tokens) {
    const int end = next_ + tokens < n_ ? next_ + tokens : n_;
    for (; next_ < end; ++next_) {
      for (size_t b = 0; b < bytes_; b += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(k_[next_] + off_ + b), _MM_HINT_T1);
        _mm_prefetch(reinterpret_cast<const char*>(v_[next_] + off_ + b), _MM_HINT_T1);
      }
    }
  }
  void Rest() { Step(n_); }

 private:
  const uint8_t* const* k_;
  const uint8_t* const* v_;
  int n_, next_ = 0;
  size_t off_, bytes_;
};

}  // namespace
}  // namespace kvarena::cpu_internal

#endif  // KVARENA_KERNELS_CPU_TILE_PREFETCHER_H_
