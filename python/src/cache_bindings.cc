// kvarena.Cache: a GenericKvCacheHandle — geometry, state, the served path and prefix
// reuse. The local path's methods are in local_bindings.cc.
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "python/src/bindings.h"
#include "python/src/convert.h"
#include "python/src/errors.h"

namespace kvarena::python {

namespace py = pybind11;

namespace {

void CheckRank4(const InTensor& t, const char* name, const Geometry& g, int64_t batch) {
  const std::vector<int64_t>& s = t.arg.shape;
  if (s.size() != 4) {
    ThrowInvalid(absl::StrCat(name, ": shape [", absl::StrJoin(s, ", "), "] has rank ", s.size(),
                              "; want [", batch, ", heads, tokens, ", g.head_dim, "]"));
  }
  if (t.arg.dtype != g.dtype) {
    ThrowInvalid(absl::StrCat(name, ": dtype ", DTypeName(t.arg.dtype), " but the cache holds ",
                              DTypeName(g.dtype)));
  }
  if (s[0] != batch || s[3] != g.head_dim) {
    ThrowInvalid(absl::StrCat(name, ": shape [", absl::StrJoin(s, ", "), "] but want [", batch,
                              ", heads, tokens, ", g.head_dim, "]"));
  }
}

// get_kv's result: (k, v), or raw (k, v, k_scales, v_scales) with k and v in the codes'
// DLPack type (int8, uint8 for fp8) and scales None when the format has none.
py::tuple GetKvTuple(GetKvResult r, bool raw) {
  if (!raw) return py::make_tuple(FromTensorOut(std::move(r.k)), FromTensorOut(std::move(r.v)));
  const bool codes = r.k.dtype == DType::kUnspecified;
  auto out = [&](TensorOut& o, bool is_codes) -> py::object {
    if (o.shape.empty()) return py::none();
    Tensor t = FromTensorOut(std::move(o));
    if (is_codes) t.dtype = ToDLDataType(r.kv_format);
    return py::cast(std::move(t));
  };
  return py::make_tuple(out(r.k, codes), out(r.v, codes), out(r.k_scales, false),
                        out(r.v_scales, false));
}

}  // namespace

void CheckKv(const InTensor& t, const char* name, const Geometry& g, int64_t batch) {
  CheckRank4(t, name, g, batch);
  if (t.arg.shape[1] != g.num_kv_heads) {
    ThrowInvalid(absl::StrCat(name, ": ", t.arg.shape[1], " heads but the cache has ",
                              g.num_kv_heads, " kv heads"));
  }
}

void CheckQ(const InTensor& t, const char* name, const Geometry& g, int64_t batch, int64_t tokens) {
  CheckRank4(t, name, g, batch);
  const int64_t heads = t.arg.shape[1];
  if (heads <= 0 || heads % g.num_kv_heads != 0) {
    ThrowInvalid(absl::StrCat(name, ": ", heads, " heads is not a positive multiple of the ",
                              g.num_kv_heads, " kv heads"));
  }
  if (t.arg.shape[2] != tokens) {
    ThrowInvalid(absl::StrCat(name, ": ", t.arg.shape[2], " tokens but k and v have ", tokens));
  }
}

CacheTensors ParseForCache(const Geometry& g, int64_t batch, py::handle q, py::handle k,
                           py::handle v) {
  CacheTensors t{q.is_none() ? InTensor{} : ParseTensor(q, "q"), ParseTensor(k, "k"),
                 ParseTensor(v, "v")};
  CheckKv(t.k, "k", g, batch);
  CheckKv(t.v, "v", g, batch);
  if (!q.is_none()) CheckQ(t.q, "q", g, batch, t.k.arg.shape[2]);
  return t;
}

AttentionOptions MakeAttentionOptions(std::optional<double> scale, std::optional<uint32_t> window) {
  AttentionOptions o;
  if (scale) o.scale = *scale;
  if (window) o.window = *window;
  return o;
}

py::object WithClient(std::shared_ptr<GenericKvCacheHandle> cache, py::handle client) {
  py::object obj = py::cast(std::move(cache));
  py::setattr(obj, "_client", client);
  return obj;
}

py::object ClientOf(py::handle cache) { return py::getattr(cache, "_client", py::none()); }

py::object Namespace(const py::dict& d) {
  return py::module_::import("types").attr("SimpleNamespace")(**d);
}

void BindCache(py::module_& /*m*/, CacheClass& c) {
  using H = GenericKvCacheHandle;
  c.def_property_readonly("cache_id", &H::cache_id)
      .def_property_readonly("num_layers", &H::num_layers)
      .def_property_readonly("num_kv_heads", &H::num_kv_heads)
      .def_property_readonly("head_dim", &H::head_dim)
      .def_property_readonly("page_size", &H::page_size)
      .def_property_readonly("dtype", [](const H& h) { return std::string(DTypeName(h.dtype())); })
      .def_property_readonly(
          "kv_format", [](const H& h) { return std::string(KvFormatName(h.layout().format())); })
      .def_property_readonly("k_scales", &H::k_scales)
      .def_property_readonly("v_scales", &H::v_scales)
      .def_property_readonly("layer_windows", &H::layer_windows)
      .def_property_readonly("max_tokens", &H::max_tokens)
      .def_property_readonly("pool_id", &H::pool_id)
      .def_property_readonly("device", &H::device)
      .def_property_readonly("num_tokens", &H::num_tokens)
      .def_property_readonly("seq_len", &H::seq_len)
      .def_property_readonly("cached_tokens", &H::cached_tokens)
      .def_property_readonly("tier_loaded_tokens", &H::tier_loaded_tokens)
      .def_property_readonly("is_valid", &H::is_valid)
      .def("layer_len", &H::layer_len, py::arg("layer"))
      .def("refresh", [](H& h) { Blocking([&] { return h.refresh(); }); })
      .def(
          "block_table",
          [](const H& h, int layer) { return Blocking([&] { return h.block_table(layer); }); },
          py::arg("layer"))
      .def("stats", [](const H& h) { return ToDict(Blocking([&] { return h.stats(); })); })
      .def(
          "append",
          [](H& h, int layer, py::handle k, py::handle v) {
            CacheTensors t = ParseForCache(Geometry::Of(h), 1, py::none(), k, v);
            AppendResult r = Blocking([&] { return h.append(layer, t.k.arg, t.v.arg); });
            py::dict d;
            d["layer_len"] = r.layer_len;
            d["seq_len"] = r.seq_len;
            return Namespace(d);
          },
          py::arg("layer"), py::arg("k"), py::arg("v"))
      .def(
          "attention",
          [](H& h, int layer, py::handle q, py::handle k, py::handle v, std::optional<double> scale,
             std::optional<uint32_t> window) {
            CacheTensors t = ParseForCache(Geometry::Of(h), 1, q, k, v);
            const AttentionOptions o = MakeAttentionOptions(scale, window);
            TensorOut out =
                Blocking([&] { return h.attention_opts(layer, t.q.arg, t.k.arg, t.v.arg, o); });
            return Like(q, FromTensorOut(std::move(out)));
          },
          py::arg("layer"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("scale") = py::none(),
          py::arg("window") = py::none())
      .def(
          "get_kv",
          [](const H& h, int layer, bool raw) {
            return GetKvTuple(Blocking([&] { return h.get_kv(layer, raw); }), raw);
          },
          py::arg("layer"), py::arg("raw") = false)
      .def(
          "get_kv_local",
          [](const H& h, int layer, bool raw) {
            return GetKvTuple(Blocking([&] { return h.get_kv_local(layer, raw); }), raw);
          },
          py::arg("layer"), py::arg("raw") = false)
      .def(
          "popn", [](H& h, int64_t n) { return Blocking([&] { return h.popn(n); }).popped; },
          py::arg("n"))
      .def(
          "reset", [](H& h, bool keep_pages) { Blocking([&] { return h.reset(keep_pages); }); },
          py::arg("keep_pages") = false)
      .def("release", [](H& h) { Blocking([&] { return h.release(); }); })
      .def(
          "set_tokens",
          [](H& h, int64_t first_pos, py::handle ids) {
            std::vector<int32_t> v = ParseTokenIds(ids, "ids");
            Blocking([&] { return h.set_tokens(first_pos, v); });
          },
          py::arg("first_pos"), py::arg("ids"))
      .def(
          "fork",
          [](py::object self, const std::string& id) {
            const H& h = self.cast<const H&>();
            return WithClient(Blocking([&] { return h.fork(id); }), ClientOf(self));
          },
          py::arg("new_cache_id") = "")
      .def("clone_handle",
           [](py::object self) {
             return WithClient(self.cast<const H&>().clone_handle(), ClientOf(self));
           })
      .def(
          "with_sequence_length",
          [](py::object self, int64_t n) {
            const H& h = self.cast<const H&>();
            return WithClient(ValueOrThrow(h.with_sequence_length(n)), ClientOf(self));
          },
          py::arg("n"))
      .def("__repr__", [](const H& h) {
        return absl::StrCat("kvarena.Cache(cache_id='", h.cache_id(),
                            "', num_tokens=", h.num_tokens(), ", dtype=", DTypeName(h.dtype()),
                            ")");
      });
}

std::vector<int32_t> ParseTokenIds(py::handle ids, const char* name) {
  if (py::isinstance<py::str>(ids) || py::isinstance<py::bytes>(ids) ||
      !py::isinstance<py::iterable>(ids)) {
    throw py::type_error(absl::StrCat(name,
                                      ": want a sequence of int token ids or an integer "
                                      "tensor, not ",
                                      std::string(py::str(py::type::of(ids).attr("__name__")))));
  }
  py::handle seq = ids;
  py::object list;
  if (py::hasattr(ids, "tolist")) {  // a torch tensor or numpy array of ids
    list = ids.attr("tolist")();
    seq = list;
  }
  std::vector<int32_t> out;
  for (py::handle v : seq) {
    if (PyBool_Check(v.ptr()) || !PyLong_Check(v.ptr())) {
      const std::string type = py::str(py::type::of(v).attr("__name__"));
      if (list) {  // a tensor of another dtype: its values are not ids
        ThrowInvalid(absl::StrCat(name, ": a tensor of dtype ",
                                  std::string(py::str(py::getattr(ids, "dtype", py::str(type)))),
                                  "; token ids need an integer dtype"));
      }
      throw py::type_error(
          absl::StrCat(name, ": element ", out.size(), " is a ", type, "; token ids are ints"));
    }
    int overflow = 0;
    const long long id = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
    if (overflow != 0 || id < INT32_MIN || id > INT32_MAX) {
      ThrowInvalid(absl::StrCat(name, ": token id ", std::string(py::str(v)), " at index ",
                                out.size(), " is out of int32 range"));
    }
    out.push_back(int32_t(id));
  }
  return out;
}

}  // namespace kvarena::python
