// The paged KV geometry (DType, PageLayout, PagedKvView, PageCopy) lives with the client's
// public headers, since workers address the pool with it: client/include/kvarena/paged_kv.h.
#ifndef KVARENA_KERNELS_PAGED_KV_H_
#define KVARENA_KERNELS_PAGED_KV_H_

#include "kvarena/paged_kv.h"

#endif  // KVARENA_KERNELS_PAGED_KV_H_
