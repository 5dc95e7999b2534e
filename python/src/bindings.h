// The pieces of the _kvarena extension module (module.cc puts them together) and the
// checks they share. Each Bind* adds its methods to the classes module.cc created, so
// that Client, Cache and the local path's types can live in separate files.
#ifndef KVARENA_PYTHON_SRC_BINDINGS_H_
#define KVARENA_PYTHON_SRC_BINDINGS_H_

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "kvarena/client.h"
#include "kvarena/kv_cache_handle.h"
#include "python/src/dlpack_tensor.h"

namespace kvarena::python {

using ClientClass = pybind11::class_<Client, std::shared_ptr<Client>>;
using CacheClass = pybind11::class_<GenericKvCacheHandle, std::shared_ptr<GenericKvCacheHandle>>;

void BindClient(pybind11::module_& m, ClientClass& client);
void BindCache(pybind11::module_& m, CacheClass& cache);
void BindLocalPath(pybind11::module_& m, ClientClass& client, CacheClass& cache);

// What tensors passed for a cache (or a batch of caches of one pool) must match.
struct Geometry {
  DType dtype = DType::kUnspecified;
  int num_kv_heads = 0;
  int head_dim = 0;
  static Geometry Of(const GenericKvCacheHandle& cache) {
    return {cache.dtype(), cache.num_kv_heads(), cache.head_dim()};
  }
};

// k or v: [batch, num_kv_heads, tokens, head_dim] in the cache's dtype. Raises
// InvalidArgument naming the tensor and the numbers.
void CheckKv(const InTensor& t, const char* name, const Geometry& g, int64_t batch);
// q (or out): [batch, h * num_kv_heads, tokens, head_dim], tokens as k's.
void CheckQ(const InTensor& t, const char* name, const Geometry& g, int64_t batch, int64_t tokens);

// Token ids from a sequence of ints or an integer tensor / array (its tolist()); `name`
// labels errors. TypeError for a str, a non-iterable or an element that is not an int;
// InvalidArgument for a tensor of a non-integer dtype or an id outside int32.
std::vector<int32_t> ParseTokenIds(pybind11::handle ids, const char* name);

// q (None: absent), k and v parsed and checked against a cache's geometry: k/v as CheckKv,
// q as CheckQ with k's tokens; batch is 1 for one cache.
struct CacheTensors {
  InTensor q, k, v;
};
CacheTensors ParseForCache(const Geometry& g, int64_t batch, pybind11::handle q, pybind11::handle k,
                           pybind11::handle v);

// attention's scale= / window= arguments (None: the cache's defaults).
AttentionOptions MakeAttentionOptions(std::optional<double> scale, std::optional<uint32_t> window);

// A Cache object remembers the Client it came from (its `_client` attribute: pool_view
// reads the pool's size from the Client's stats). WithClient wraps a handle a call on
// `client` returned; ClientOf gives a Cache's (None when it has none).
pybind11::object WithClient(std::shared_ptr<GenericKvCacheHandle> cache, pybind11::handle client);
pybind11::object ClientOf(pybind11::handle cache);

// A types.SimpleNamespace with d's items as attributes (the result structs).
pybind11::object Namespace(const pybind11::dict& d);

}  // namespace kvarena::python

#endif  // KVARENA_PYTHON_SRC_BINDINGS_H_
