// kvarena.connect and kvarena.Client: allocation, lookup, arena stats and health.
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "python/src/bindings.h"
#include "python/src/convert.h"
#include "python/src/errors.h"

namespace kvarena::python {

namespace py = pybind11;

void BindClient(py::module_& m, ClientClass& c) {
  m.def(
      "_connect",
      [](const std::string& address, const py::kwargs& kwargs) {
        const ClientOptions options = ParseClientOptions(kwargs);
        return Blocking([&] { return Client::Connect(address, options); });
      },
      py::arg("address"));

  c.def_property_readonly("address", &Client::address)
      .def_property_readonly("session_id", &Client::session_id)
      .def_property_readonly("is_inproc", &Client::is_inproc)
      .def_property_readonly("connected", &Client::connected)
      .def_property_readonly("resumes", &Client::resumes)
      .def(
          "allocate",
          [](py::object self, int num_layers, int num_kv_heads, int head_dim, py::handle dtype,
             int page_size, std::optional<std::vector<int>> layer_windows, int64_t max_tokens,
             const std::string& prefix_namespace, py::handle prompt_tokens,
             const std::string& cache_id, py::handle kv_format,
             std::optional<std::vector<float>> k_scales,
             std::optional<std::vector<float>> v_scales) {
            CacheSpec spec;
            spec.num_layers = num_layers;
            spec.num_kv_heads = num_kv_heads;
            spec.head_dim = head_dim;
            spec.dtype = ParseDType(dtype);
            spec.page_size = page_size;
            if (layer_windows) spec.layer_windows = *layer_windows;
            spec.max_tokens = max_tokens;
            spec.prefix_namespace = prefix_namespace;
            spec.kv_format = ParseKvFormat(kv_format);
            if (k_scales) spec.k_scales = *k_scales;
            if (v_scales) spec.v_scales = *v_scales;
            AllocateOptions options;
            if (!prompt_tokens.is_none())
              options.prompt_tokens = ParseTokenIds(prompt_tokens, "prompt_tokens");
            Client& client = self.cast<Client&>();
            return WithClient(Blocking([&] { return client.Allocate(spec, cache_id, options); }),
                              self);
          },
          py::arg("num_layers"), py::arg("num_kv_heads"), py::arg("head_dim"), py::arg("dtype"),
          py::arg("page_size") = 0, py::arg("layer_windows") = py::none(),
          py::arg("max_tokens") = 0, py::arg("prefix_namespace") = "",
          py::arg("prompt_tokens") = py::none(), py::arg("cache_id") = "",
          py::arg("kv_format") = py::none(), py::arg("k_scales") = py::none(),
          py::arg("v_scales") = py::none())
      .def(
          "open_cache",
          [](py::object self, const std::string& id) {
            Client& client = self.cast<Client&>();
            return WithClient(Blocking([&] { return client.OpenCache(id); }), self);
          },
          py::arg("cache_id"))
      .def(
          "release",
          [](Client& client, const std::string& id) {
            Blocking([&] { return client.Release(id); });
          },
          py::arg("cache_id"))
      .def("stats", [](Client& client) { return ToDict(Blocking([&] { return client.Stats(); })); })
      .def(
          "cache_stats",
          [](Client& client, const std::string& id) {
            return ToDict(Blocking([&] { return client.CacheStats(id); }));
          },
          py::arg("cache_id"))
      .def("list_caches",
           [](Client& client) {
             std::vector<CacheInfo> caches = Blocking([&] { return client.ListCaches(); });
             py::list out;
             for (const CacheInfo& info : caches) out.append(ToDict(info));
             return out;
           })
      .def(
          "health",
          [](Client& client, const std::string& service) {
            return std::string(ServingStatusName(Blocking([&] { return client.Health(service); })));
          },
          py::arg("service") = "")
      .def("ping", [](Client& client) { Blocking([&] { return client.Ping(); }); })
      .def("call_counts", [](const Client& client) { return ToDict(client.call_counts()); })
      .def("__repr__", [](const Client& client) {
        return "kvarena.Client(address='" + client.address() + "')";
      });
}

}  // namespace kvarena::python
