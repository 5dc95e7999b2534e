// The _kvarena extension module: the C++ client (client/include/kvarena/) for Python,
// with no framework linked. kvarena/__init__.py is its public face.
#include <pybind11/pybind11.h>

#include <memory>

#include "python/src/bindings.h"
#include "python/src/dlpack_tensor.h"
#include "python/src/errors.h"

namespace py = pybind11;

PYBIND11_MODULE(_kvarena, m) {
  using namespace kvarena::python;
  m.doc() = "kvarena's C++ client; use the kvarena package, not this module";
  RegisterErrors(m);
  BindTensor(m);
  ClientClass client(m, "Client", "A connection to the KV arena (kvarena.connect makes one).");
  CacheClass cache(m, "Cache", py::dynamic_attr(),
                   "A reference to one paged KV cache in the arena.");
  BindClient(m, client);
  BindCache(m, cache);
  BindLocalPath(m, client, cache);
}
