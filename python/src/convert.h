// Conversions between the C++ client's value types and Python: dtype names, ClientOptions
// from keyword arguments, and the stats / info structs as dicts keyed by the C++ field
// names. Plain functions; call them with the GIL held.
#ifndef KVARENA_PYTHON_SRC_CONVERT_H_
#define KVARENA_PYTHON_SRC_CONVERT_H_

#include <pybind11/pybind11.h>

#include "kvarena/client.h"
#include "kvarena/types.h"

namespace kvarena::python {

// "float16" / "bfloat16" / "float32", a torch dtype or a numpy dtype (or its type).
// InvalidArgument for anything else.
DType ParseDType(pybind11::handle dtype);
// A KV format name ("float16", "int8", ... : kvarena/paged_kv.h's table), or None for
// the activation dtype's own.
KvFormat ParseKvFormat(pybind11::handle kv_format);

// ClientOptions from keyword arguments named as its fields; durations in seconds.
// TypeError for an unknown name.
ClientOptions ParseClientOptions(const pybind11::kwargs& kwargs);

pybind11::dict ToDict(const PageStats& s);
pybind11::dict ToDict(const PoolStats& s);
pybind11::dict ToDict(const TierStats& s);
pybind11::dict ToDict(const ArenaStats& s);
pybind11::dict ToDict(const CacheInfo& info);
pybind11::dict ToDict(const CallCounts& c);

}  // namespace kvarena::python

#endif  // KVARENA_PYTHON_SRC_CONVERT_H_
