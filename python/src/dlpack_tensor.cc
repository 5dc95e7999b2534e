#include "python/src/dlpack_tensor.h"

#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "python/src/errors.h"

namespace kvarena::python {

namespace py = pybind11;

namespace {

constexpr char kCapsuleName[] = "dltensor";

DType FromDLDataType(const DLDataType& t) {
  if (t.lanes != 1) return DType::kUnspecified;
  if (t.code == kDLFloat && t.bits == 32) return DType::kFloat32;
  if (t.code == kDLFloat && t.bits == 16) return DType::kFloat16;
  if (t.code == kDLBfloat && t.bits == 16) return DType::kBFloat16;
  return DType::kUnspecified;
}

std::string DTypeString(const DLDataType& t) {
  switch (t.code) {
    case kDLFloat:
      return absl::StrCat("float", t.bits);
    case kDLBfloat:
      return absl::StrCat("bfloat", t.bits);
    case kDLInt:
      return absl::StrCat("int", t.bits);
    case kDLUInt:
      return absl::StrCat("uint", t.bits);
    default:
      return absl::StrCat("dlpack_code", int(t.code), "_", t.bits);
  }
}

std::string DeviceString(const DLDevice& d) {
  if (d.device_type == kDLCPU) return "cpu";
  if (d.device_type == kDLCUDA) return absl::StrCat("cuda:", d.device_id);
  if (d.device_type == kDLCUDAHost) return "cuda_host";
  return absl::StrCat("dlpack_device", int(d.device_type), ":", d.device_id);
}

// Whether strides (elements; null: C-contiguous) describe a C-contiguous tensor. Sizes
// of 0 or 1 make their dimension's stride irrelevant, as torch treats them.
bool IsContiguous(int ndim, const int64_t* shape, const int64_t* strides) {
  if (strides == nullptr) return true;
  int64_t expected = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (shape[i] == 0) return true;
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

InTensor Check(InTensor in, const char* name, DType dtype, const std::string& dtype_name,
               const std::string& device, bool contiguous) {
  if (device != "cpu" && device != "cuda_host") {
    ThrowInvalid(absl::StrCat(name, ": tensor on ", device,
                              "; the kvarena client takes host tensors (move it to the CPU)"));
  }
  if (!contiguous) {
    ThrowInvalid(absl::StrCat(name, ": tensor of shape [", absl::StrJoin(in.arg.shape, ", "),
                              "] is not contiguous (call .contiguous())"));
  }
  if (dtype == DType::kUnspecified) {
    ThrowInvalid(
        absl::StrCat(name, ": dtype ", dtype_name, " is not one of float32, float16, bfloat16"));
  }
  in.arg.dtype = dtype;
  return in;
}

InTensor FromBuffer(py::handle obj, const char* name, Access access);

[[noreturn]] void ThrowReadOnly(py::handle obj, const char* name, const char* why) {
  ThrowInvalid(absl::StrCat(name, ": ", std::string(py::str(py::type::of(obj))), " is read-only (",
                            why, "); the library writes into it: pass writable memory"));
}

InTensor FromDLPack(py::handle obj, const char* name, Access access) {
  if (access == Access::kWrite) {  // numpy says so; DLPack 0.6 cannot
    py::object flags = py::getattr(obj, "flags", py::none());
    if (!flags.is_none() && py::hasattr(flags, "writeable") &&
        !py::bool_(flags.attr("writeable"))) {
      ThrowReadOnly(obj, name, "flags.writeable is False");
    }
  }
  py::object cap;
  try {
    cap = obj.attr("__dlpack__")();
  } catch (py::error_already_set& e) {
    // numpy refuses to export a read-only array through DLPack; its buffer still reads.
    if (PyObject_CheckBuffer(obj.ptr())) return FromBuffer(obj, name, access);
    ThrowInvalid(absl::StrCat(name, ": __dlpack__ failed: ", e.what()));
  }
  if (!PyCapsule_IsValid(cap.ptr(), kCapsuleName)) {
    ThrowInvalid(absl::StrCat(name, ": __dlpack__ did not return an unused DLPack capsule"));
  }
  auto* mt = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap.ptr(), kCapsuleName));
  const DLTensor& t = mt->dl_tensor;
  InTensor in;
  in.arg.shape.assign(t.shape, t.shape + t.ndim);
  in.arg.data = static_cast<const uint8_t*>(t.data) + t.byte_offset;
  int64_t n = 1;
  for (int64_t d : in.arg.shape) n *= d;
  in.arg.bytes = size_t(n) * ((t.dtype.bits * t.dtype.lanes + 7) / 8);
  // The capsule stays unconsumed: its destructor runs the producer's deleter.
  in.keep = std::move(cap);
  return Check(std::move(in), name, FromDLDataType(t.dtype), DTypeString(t.dtype),
               DeviceString(t.device), IsContiguous(t.ndim, t.shape, t.strides));
}

InTensor FromBuffer(py::handle obj, const char* name, Access access) {
  py::object view = py::reinterpret_steal<py::object>(PyMemoryView_FromObject(obj.ptr()));
  if (!view) throw py::error_already_set();
  const Py_buffer* b = PyMemoryView_GET_BUFFER(view.ptr());
  if (access == Access::kWrite && b->readonly) {
    ThrowReadOnly(obj, name, "its buffer is read-only: a read-only memmap, bytes, ...");
  }
  InTensor in;
  in.arg.shape.assign(b->shape, b->shape + b->ndim);
  in.arg.data = b->buf;
  in.arg.bytes = size_t(b->len);
  std::string format = b->format != nullptr ? b->format : "B";
  if (!format.empty() && (format[0] == '<' || format[0] == '=' || format[0] == '@')) {
    format.erase(0, 1);
  }
  const DType dtype = format == "f"   ? DType::kFloat32
                      : format == "e" ? DType::kFloat16
                                      : DType::kUnspecified;
  in.keep = std::move(view);
  return Check(std::move(in), name, dtype, "buffer format '" + format + "'", "cpu",
               PyBuffer_IsContiguous(b, 'C') != 0);
}

struct ExportContext {
  DLManagedTensor managed{};
  std::vector<int64_t> shape, strides;
  std::shared_ptr<const void> owner;
};

void DeleteExport(DLManagedTensor* managed) {
  delete static_cast<ExportContext*>(managed->manager_ctx);
}

// A capsule nobody consumed still owns its tensor.
void DestroyCapsule(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, kCapsuleName)) return;
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
}

py::object ToCapsule(const Tensor& t) {
  auto* ctx = new ExportContext;
  ctx->shape = t.shape;
  ctx->strides = t.strides;
  if (ctx->strides.empty()) {  // torch 1.13 reads strides unconditionally: always give them
    ctx->strides.resize(t.shape.size());
    int64_t s = 1;
    for (size_t i = t.shape.size(); i-- > 0;) {
      ctx->strides[i] = s;
      s *= t.shape[i];
    }
  }
  ctx->owner = t.owner;
  DLTensor& d = ctx->managed.dl_tensor;
  d.data = t.data;
  d.device = t.device;
  d.ndim = int(t.shape.size());
  d.dtype = t.dtype;
  d.shape = ctx->shape.data();
  d.strides = ctx->strides.data();
  d.byte_offset = 0;
  ctx->managed.manager_ctx = ctx;
  ctx->managed.deleter = DeleteExport;
  PyObject* capsule = PyCapsule_New(&ctx->managed, kCapsuleName, DestroyCapsule);
  if (capsule == nullptr) {
    delete ctx;
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(capsule);
}

template <typename T>
Tensor OwnVector(std::vector<T> v, std::vector<int64_t> shape, DLDataType dtype) {
  auto owned = std::make_shared<std::vector<T>>(std::move(v));
  Tensor t;
  t.data = owned->data();
  t.owner = std::move(owned);
  t.dtype = dtype;
  t.shape = std::move(shape);
  return t;
}

}  // namespace

InTensor ParseTensor(py::handle obj, const char* name, Access access) {
  if (obj.is_none()) ThrowInvalid(absl::StrCat(name, ": a tensor is required, got None"));
  if (py::hasattr(obj, "__dlpack__")) return FromDLPack(obj, name, access);
  if (PyObject_CheckBuffer(obj.ptr())) return FromBuffer(obj, name, access);
  ThrowInvalid(absl::StrCat(name, ": ", std::string(py::str(py::type::of(obj))),
                            " has neither __dlpack__ nor the buffer protocol"));
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

DLDataType ToDLDataType(DType t) {
  const DTypeInfo* info = FindDType(t);
  if (info == nullptr) return {kDLFloat, 0, 1};
  return {uint8_t(info->dlpack_code), uint8_t(8 * info->bytes), 1};
}

DLDataType ToDLDataType(KvFormat f) {
  const KvFormatInfo* info = FindKvFormat(f);
  if (info == nullptr) return {kDLFloat, 0, 1};
  return {uint8_t(info->dlpack_code), uint8_t(8 * info->elem_bytes), 1};
}

Tensor FromTensorOut(TensorOut out) {
  auto owned = std::make_shared<TensorOut>(std::move(out));
  Tensor t;
  t.data = owned->data.data();
  t.dtype = ToDLDataType(owned->dtype);
  t.shape = owned->shape;
  t.owner = std::move(owned);
  return t;
}

Tensor FromVector(std::vector<int32_t> v, std::vector<int64_t> shape) {
  return OwnVector(std::move(v), std::move(shape), DLDataType{kDLInt, 32, 1});
}
Tensor FromVector(std::vector<int64_t> v, std::vector<int64_t> shape) {
  return OwnVector(std::move(v), std::move(shape), DLDataType{kDLInt, 64, 1});
}

Tensor NewTensor(DType dtype, std::vector<int64_t> shape) {
  Tensor t;
  t.dtype = ToDLDataType(dtype);
  t.shape = std::move(shape);
  auto bytes = std::make_shared<std::vector<uint8_t>>(t.nbytes());
  t.data = bytes->data();
  t.owner = std::move(bytes);
  return t;
}

py::object Like(py::handle like, Tensor t) {
  const bool bf16 = t.dtype.code == kDLBfloat;
  py::object out = py::cast(std::move(t));
  const std::string module = py::str(py::type::handle_of(like).attr("__module__"));
  if (module == "torch" || module.rfind("torch.", 0) == 0) {
    return py::module_::import("torch").attr("from_dlpack")(out);
  }
  if (module == "numpy" && !bf16) {  // numpy has no bfloat16
    return py::module_::import("numpy").attr("from_dlpack")(out);
  }
  return out;
}

void BindTensor(py::module_& m) {
  py::class_<Tensor>(m, "Tensor",
                     "A typed view of memory the kvarena client owns or maps; consume it "
                     "with torch.from_dlpack / numpy.from_dlpack / numpy.asarray (no copy).")
      .def(
          "__dlpack__", [](const Tensor& t, py::object /*stream*/) { return ToCapsule(t); },
          py::arg("stream") = py::none())
      // np.asarray(t) / np.array(t): the same memory through numpy.from_dlpack (no copy
      // unless dtype or copy ask for one). numpy has no bfloat16 and takes host memory only.
      .def(
          "__array__",
          [](py::object self, py::object dtype, py::object copy) {
            const Tensor& t = self.cast<const Tensor&>();
            if (t.dtype.code == kDLBfloat) {
              throw py::type_error(absl::StrCat(
                  "kvarena.Tensor of dtype ", DTypeString(t.dtype),
                  ": numpy has no bfloat16; take it with torch.from_dlpack(t) (no copy)"));
            }
            if (t.device.device_type != kDLCPU) {
              throw py::type_error(absl::StrCat("kvarena.Tensor on ", DeviceString(t.device),
                                                ": numpy takes host memory; take it with "
                                                "torch.from_dlpack(t) (no copy)"));
            }
            py::object a = py::module_::import("numpy").attr("from_dlpack")(self);
            if (!dtype.is_none()) a = a.attr("astype")(dtype, py::arg("copy") = false);
            if (!copy.is_none() && py::bool_(copy)) a = a.attr("copy")();
            return a;
          },
          py::arg("dtype") = py::none(), py::arg("copy") = py::none())
      .def("__dlpack_device__",
           [](const Tensor& t) {
             return py::make_tuple(int(t.device.device_type), t.device.device_id);
           })
      .def_property_readonly("shape", [](const Tensor& t) { return py::tuple(py::cast(t.shape)); })
      .def_property_readonly("dtype", [](const Tensor& t) { return DTypeString(t.dtype); })
      .def_property_readonly("device", [](const Tensor& t) { return DeviceString(t.device); })
      .def_property_readonly("data_ptr", [](const Tensor& t) { return uintptr_t(t.data); })
      .def_property_readonly("nbytes", [](const Tensor& t) { return t.nbytes(); })
      .def("__repr__", [](const Tensor& t) {
        return absl::StrCat("kvarena.Tensor(shape=[", absl::StrJoin(t.shape, ", "),
                            "], dtype=", DTypeString(t.dtype), ", device=", DeviceString(t.device),
                            ")");
      });
}

}  // namespace kvarena::python
