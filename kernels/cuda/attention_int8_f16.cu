// Instantiates the __half attention kernels over int8 pages for head_dim 64, 128 and 256.
#include "kernels/cuda/attention_impl.cuh"

namespace kvarena::gpu {
KVARENA_ATTENTION_FOR_HEAD_DIMS(__half, Int8Kv, /* not extern */)
}  // namespace kvarena::gpu
