#include "python/src/convert.h"

#include <pybind11/stl.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "python/src/errors.h"

// One field of `s` into the dict `d` under its own name (the *_FIELDS lists in
// kvarena/types.h).
#define KVARENA_FIELD_TO_DICT(f) d[#f] = s.f;

namespace kvarena::python {

namespace py = pybind11;

namespace {

DType DTypeFromName(const std::string& name) {
  if (name == "float") return DType::kFloat32;  // torch's aliases
  if (name == "half") return DType::kFloat16;
  for (const DTypeInfo& t : kDTypes) {
    if (name == t.name) return t.dtype;
  }
  return DType::kUnspecified;
}

std::string TypeName(py::handle v) { return py::str(py::type::of(v).attr("__name__")); }

// connect()'s option values: the Python type an option takes (TypeError otherwise), then
// its range (InvalidArgument naming the option and the value).
[[noreturn]] void ThrowType(const std::string& field, py::handle v, const char* want) {
  throw py::type_error(absl::StrCat("connect(): ", field, " takes ", want, ", not ", TypeName(v)));
}

absl::Duration Seconds(py::handle v, const std::string& field) {
  if (PyBool_Check(v.ptr()) || !(PyFloat_Check(v.ptr()) || PyLong_Check(v.ptr()))) {
    ThrowType(field, v, "a number of seconds");
  }
  const double s = PyFloat_AsDouble(v.ptr());
  if (!std::isfinite(s) || s < 0) {
    ThrowInvalid(absl::StrCat(field, "=", s, ": a duration in seconds, finite and >= 0"));
  }
  return absl::Seconds(s);
}

int64_t Int(py::handle v, const std::string& field, int64_t lo, int64_t hi) {
  if (PyBool_Check(v.ptr()) || !PyLong_Check(v.ptr())) ThrowType(field, v, "an int");
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
  if (overflow != 0 || x < lo || x > hi) {
    ThrowInvalid(
        absl::StrCat(field, "=", std::string(py::str(v)), " is outside [", lo, ", ", hi, "]"));
  }
  return x;
}

bool Bool(py::handle v, const std::string& field) {
  if (!PyBool_Check(v.ptr())) ThrowType(field, v, "a bool");
  return v.ptr() == Py_True;
}

std::string Str(py::handle v, const std::string& field) {
  if (!py::isinstance<py::str>(v)) ThrowType(field, v, "a str");
  return v.cast<std::string>();
}

// A file option: a str or an os.PathLike.
std::string Path(py::handle v, const std::string& field) {
  if (!py::isinstance<py::str>(v) && !py::hasattr(v, "__fspath__")) {
    ThrowType(field, v, "a str or os.PathLike");
  }
  return Str(py::module_::import("os").attr("fspath")(v), field);
}

}  // namespace

DType ParseDType(py::handle dtype) {
  std::string name;
  if (py::isinstance<py::str>(dtype)) {
    name = dtype.cast<std::string>();
  } else {
    const std::string module = py::str(py::type::handle_of(dtype).attr("__module__"));
    if (module == "torch") {  // torch.float16 prints as "torch.float16"
      name = py::str(dtype);
      if (name.rfind("torch.", 0) == 0) name.erase(0, 6);
    } else if (py::hasattr(dtype, "__module__") || module == "numpy") {
      try {  // np.float16, np.dtype("float16")
        name = py::str(py::module_::import("numpy").attr("dtype")(dtype).attr("name"));
      } catch (py::error_already_set&) {
        name = py::str(dtype);
      }
    } else {
      name = py::str(dtype);
    }
  }
  const DType t = DTypeFromName(name);
  if (t == DType::kUnspecified) {
    ThrowInvalid(absl::StrCat("dtype=", name, ": not one of float16, bfloat16, float32"));
  }
  return t;
}

KvFormat ParseKvFormat(py::handle kv_format) {
  if (kv_format.is_none()) return KvFormat::kUnspecified;
  if (!py::isinstance<py::str>(kv_format)) ThrowType("kv_format", kv_format, "str or None");
  const std::string name = kv_format.cast<std::string>();
  std::string names;
  for (const KvFormatInfo& f : kKvFormats) {
    if (name == f.name) return f.format;
    absl::StrAppend(&names, names.empty() ? "" : ", ", f.name);
  }
  ThrowInvalid(absl::StrCat("kv_format=", name, ": not one of ", names));
}

ClientOptions ParseClientOptions(const py::kwargs& kwargs) {
  ClientOptions o;
  for (auto [key, value] : kwargs) {
    const std::string k = py::str(key);
    if (k == "client_name")
      o.client_name = Str(value, k);
    else if (k == "call_timeout")
      o.call_timeout = Seconds(value, k);
    else if (k == "connect_timeout")
      o.connect_timeout = Seconds(value, k);
    else if (k == "attach")
      o.attach = Bool(value, k);
    else if (k == "resume")
      o.resume = Bool(value, k);
    else if (k == "inline_tensors")
      o.inline_tensors = Bool(value, k);
    else if (k == "num_threads")
      o.num_threads = int(Int(value, k, -1, INT_MAX));
    else if (k == "max_message_bytes")  // Client::Connect checks the range it takes
      o.max_message_bytes = size_t(Int(value, k, 0, INT64_MAX));
    else if (k == "arena_bytes")
      o.arena_bytes = size_t(Int(value, k, 0, INT64_MAX));
    else if (k == "page_size")
      o.page_size = int(Int(value, k, 0, INT_MAX));
    else if (k == "tls_ca_file")
      o.tls_ca_file = Path(value, k);
    else if (k == "tls_cert_file")
      o.tls_cert_file = Path(value, k);
    else if (k == "tls_key_file")
      o.tls_key_file = Path(value, k);
    else if (k == "tls_target_name")
      o.tls_target_name = Str(value, k);
    else if (k == "auth_token")
      o.auth_token = Str(value, k);
    else if (k == "auth_token_file")
      o.auth_token_file = Path(value, k);
    else
      throw py::type_error(absl::StrCat("connect() got an unknown option '", k,
                                        "' (ClientOptions has no such field)"));
  }
  return o;
}

py::dict ToDict(const PageStats& s) {
  py::dict d;
  KVARENA_PAGE_STATS_FIELDS(KVARENA_FIELD_TO_DICT)
  return d;
}

py::dict ToDict(const PoolStats& s) {
  py::dict d;
  KVARENA_POOL_STATS_FIELDS(KVARENA_FIELD_TO_DICT)
  d["dtype"] = DTypeName(s.layout.dtype);
  d["kv_format"] = KvFormatName(s.layout.format());
  d["page_size"] = s.layout.page_size;
  d["num_kv_heads"] = s.layout.num_kv_heads;
  d["head_dim"] = s.layout.head_dim;
  d["owner"] = s.owner;  // the pool's tenant; "" without --tenants_file
  return d;
}

py::dict ToDict(const TierStats& s) {
  py::dict d;
  KVARENA_TIER_STATS_FIELDS(KVARENA_FIELD_TO_DICT)
  return d;
}

py::dict ToDict(const ArenaStats& s) {
  py::dict d;
  KVARENA_ARENA_STATS_FIELDS(KVARENA_FIELD_TO_DICT)
  d["pages"] = ToDict(s.pages);
  py::list pools;
  for (const PoolStats& p : s.pools) pools.append(ToDict(p));
  d["pools"] = pools;
  d["sessions_in_grace"] = s.sessions_in_grace;
  d["sessions_opened"] = s.sessions_opened;
  d["sessions_detached"] = s.sessions_detached;
  d["sessions_resumed"] = s.sessions_resumed;
  d["sessions_reaped"] = s.sessions_reaped;
  d["caches_reaped_grace"] = s.caches_reaped_grace;
  d["caches_reaped_idle"] = s.caches_reaped_idle;
  py::list tiers;
  for (const TierStats& t : s.tiers) tiers.append(ToDict(t));
  d["tiers"] = tiers;
  return d;
}

py::dict ToDict(const CacheInfo& info) {
  py::dict d;
  d["cache_id"] = info.cache_id;
  d["num_layers"] = info.spec.num_layers;
  d["num_kv_heads"] = info.spec.num_kv_heads;
  d["head_dim"] = info.spec.head_dim;
  d["dtype"] = DTypeName(info.spec.dtype);
  d["kv_format"] = KvFormatName(info.spec.kv_format);
  d["k_scales"] = info.spec.k_scales;
  d["v_scales"] = info.spec.v_scales;
  d["page_size"] = info.spec.page_size;
  d["layer_windows"] = info.spec.layer_windows;
  d["max_tokens"] = info.spec.max_tokens;
  d["prefix_namespace"] = info.spec.prefix_namespace;
  d["seq_len"] = info.seq_len;
  d["layer_lens"] = info.layer_lens;
  d["layer_first_pos"] = info.layer_first_pos;
  d["pool_id"] = info.pool_id;
  d["page_bytes"] = info.page_bytes;
  d["cached_tokens"] = info.cached_tokens;
  d["tier_loaded_tokens"] = info.tier_loaded_tokens;
  d["tokens_known"] = info.tokens_known;
  return d;
}

py::dict ToDict(const CallCounts& c) {
  py::dict d;
  d["reserve"] = c.reserve;
  d["commit"] = c.commit;
  d["describe"] = c.describe;
  return d;
}

}  // namespace kvarena::python
