// The API's value types live with the client's public headers, which workers build
// against: client/include/kvarena/types.h.
#ifndef KVARENA_CORE_TYPES_H_
#define KVARENA_CORE_TYPES_H_

#include "kvarena/types.h"

#endif  // KVARENA_CORE_TYPES_H_
