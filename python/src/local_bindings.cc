// The local path from Python: reserve / commit, the handle's own block table, the mapped
// pool as a zero-copy DLPack view, vLLM's and FlashInfer's page-table arrays, and
// DecodeBatch (kvarena/decode_batch.h).
#include <pybind11/stl.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvarena/decode_batch.h"
#include "kvarena/page_tables.h"
#include "python/src/bindings.h"
#include "python/src/convert.h"
#include "python/src/errors.h"

namespace kvarena::python {

namespace py = pybind11;

namespace {

using H = GenericKvCacheHandle;

// The pool's page count: its row in the arena's stats (one RPC).
int64_t PoolPages(const std::shared_ptr<Client>& client, uint64_t pool_id) {
  ArenaStats stats = ValueOrThrow(client->Stats());
  for (const PoolStats& p : stats.pools) {
    if (p.pool_id == pool_id) return p.num_pages;
  }
  throw StatusError(absl::NotFoundError(
      absl::StrCat("pool_view: pool ", pool_id, " is not in the arena's stats")));
}

// DecodeBatch is not thread-safe; the Python object serialises its calls.
struct PyDecodeBatch {
  std::unique_ptr<DecodeBatch> batch;
  std::mutex mu;
  Geometry geometry;
};

// k, v and q of one step of a batch, checked against its geometry and tokens_per_step.
CacheTensors ParseStep(const PyDecodeBatch& b, py::handle q, py::handle k, py::handle v) {
  CacheTensors s = ParseForCache(b.geometry, b.batch->batch_size(), q, k, v);
  const int64_t t = b.batch->tokens_per_step();
  if (s.k.arg.shape[2] != t || s.v.arg.shape[2] != t) {
    ThrowInvalid(absl::StrCat("k/v: ", s.k.arg.shape[2], "/", s.v.arg.shape[2],
                              " tokens but the batch appends tokens_per_step=", t));
  }
  return s;
}

void BindDecodeBatch(py::module_& m) {
  py::class_<PyDecodeBatch>(m, "DecodeBatch")
      .def_property_readonly("batch_size", [](PyDecodeBatch& b) { return b.batch->batch_size(); })
      .def_property_readonly("tokens_per_step",
                             [](PyDecodeBatch& b) { return b.batch->tokens_per_step(); })
      .def_property_readonly("max_blocks",
                             [](PyDecodeBatch& b) {
                               std::lock_guard<std::mutex> l(b.mu);
                               return b.batch->max_blocks();
                             })
      .def("plan",
           [](PyDecodeBatch& b) {
             Blocking([&] {
               std::lock_guard<std::mutex> l(b.mu);
               return b.batch->Plan();
             });
           })
      .def("positions",
           [](PyDecodeBatch& b) {
             std::lock_guard<std::mutex> l(b.mu);
             std::vector<int64_t> p(size_t(b.batch->batch_size()));
             for (int i = 0; i < b.batch->batch_size(); ++i) p[size_t(i)] = b.batch->position(i);
             return p;
           })
      .def(
          "run",
          [](PyDecodeBatch& b, int layer, py::handle q, py::handle k, py::handle v, py::object out,
             std::optional<double> scale, std::optional<uint32_t> window) {
            CacheTensors s = ParseStep(b, q, k, v);
            std::optional<Tensor> fresh;
            InTensor out_in;
            TensorBuffer buf;
            if (out.is_none()) {
              fresh = NewTensor(b.geometry.dtype, s.q.arg.shape);
              buf = {fresh->data, fresh->nbytes()};
            } else {
              out_in = ParseTensor(out, "out", Access::kWrite);
              CheckQ(out_in, "out", b.geometry, b.batch->batch_size(), b.batch->tokens_per_step());
              if (out_in.arg.shape != s.q.arg.shape) ThrowInvalid("out: shape differs from q's");
              buf = {const_cast<void*>(out_in.arg.data), out_in.arg.bytes};
            }
            Blocking([&] {
              std::lock_guard<std::mutex> l(b.mu);
              return b.batch->Run(layer, s.q.arg, s.k.arg, s.v.arg, buf,
                                  MakeAttentionOptions(scale, window));
            });
            return fresh ? Like(q, std::move(*fresh)) : out;
          },
          py::arg("layer"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out") = py::none(),
          py::arg("scale") = py::none(), py::arg("window") = py::none())
      .def(
          "append",
          [](PyDecodeBatch& b, int layer, py::handle k, py::handle v) {
            CacheTensors s = ParseStep(b, py::none(), k, v);
            Blocking([&] {
              std::lock_guard<std::mutex> l(b.mu);
              return b.batch->Append(layer, s.k.arg, s.v.arg);
            });
          },
          py::arg("layer"), py::arg("k"), py::arg("v"))
      .def("commit",
           [](PyDecodeBatch& b) {
             Blocking([&] {
               std::lock_guard<std::mutex> l(b.mu);
               return b.batch->Commit();
             });
           })
      .def(
          "block_tables",
          [](PyDecodeBatch& b, int layer) {
            std::lock_guard<std::mutex> l(b.mu);
            if (layer < 0 || b.batch->block_tables(layer) == nullptr) {
              ThrowInvalid(
                  absl::StrCat("block_tables: no table for layer=", layer, " (plan first)"));
            }
            const int64_t rows = b.batch->batch_size(), cols = b.batch->max_blocks();
            const int32_t* t = b.batch->block_tables(layer);
            return FromVector(std::vector<int32_t>(t, t + rows * cols), {rows, cols});
          },
          py::arg("layer"))
      .def("stats", [](PyDecodeBatch& b) {
        std::lock_guard<std::mutex> l(b.mu);
        const DecodeBatchStats s = b.batch->stats();
        py::dict d;
        d["steps"] = s.steps;
        d["ids_written"] = s.ids_written;
        d["sequences_rebuilt"] = s.sequences_rebuilt;
        d["tables_moved"] = s.tables_moved;
        return d;
      });
}

py::object TableLike(py::handle like, Tensor t) {
  return like.is_none() ? py::cast(std::move(t)) : Like(like, std::move(t));
}

}  // namespace

void BindLocalPath(py::module_& m, ClientClass& client, CacheClass& cache) {
  cache
      .def(
          "reserve", [](H& h, int64_t n) { Blocking([&] { return h.reserve(n); }); }, py::arg("n"))
      .def(
          "commit", [](H& h, int64_t n) { Blocking([&] { return h.commit(n); }); }, py::arg("n"))
      .def_property("reserve_ahead", &H::reserve_ahead, &H::set_reserve_ahead)
      .def_property_readonly("reserved_until", &H::reserved_until)
      .def(
          "append_local",
          [](H& h, int layer, py::handle k, py::handle v) {
            CacheTensors t = ParseForCache(Geometry::Of(h), 1, py::none(), k, v);
            Blocking([&] { return h.append_local(layer, t.k.arg, t.v.arg); });
          },
          py::arg("layer"), py::arg("k"), py::arg("v"))
      .def(
          "attention_local",
          [](H& h, int layer, py::handle q, py::handle k, py::handle v, std::optional<double> scale,
             std::optional<uint32_t> window) {
            CacheTensors t = ParseForCache(Geometry::Of(h), 1, q, k, v);
            const AttentionOptions o = MakeAttentionOptions(scale, window);
            TensorOut out =
                Blocking([&] { return h.attention_local(layer, t.q.arg, t.k.arg, t.v.arg, o); });
            return Like(q, FromTensorOut(std::move(out)));
          },
          py::arg("layer"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("scale") = py::none(),
          py::arg("window") = py::none())
      .def(
          "local_table",
          [](const H& h, int layer) {
            LocalLayerTable t = Blocking([&] { return h.local_table(layer); });
            py::dict d;
            d["page_ids"] = t.page_ids;
            d["first_pos"] = t.first_pos;
            d["len"] = t.len;
            d["written"] = t.written;
            d["reserved_until"] = t.end(h.page_size());
            return Namespace(d);
          },
          py::arg("layer"))
      // The view holds a reference to a clone of the handle: the client (and so the pool's
      // mapping) lives while any consumer of the view does.
      .def("pool_view",
           [](py::object self) {
             const H& h = self.cast<const H&>();
             py::object owner = ClientOf(self);
             if (owner.is_none()) {
               throw StatusError(absl::FailedPreconditionError(
                   "pool_view: this Cache did not come from a Client call "
                   "(allocate, open_cache, fork)"));
             }
             std::shared_ptr<Client> client = owner.cast<std::shared_ptr<Client>>();
             KvPoolView v = Blocking([&] { return h.pool_view(); });
             const int64_t pages = [&] {
               py::gil_scoped_release nogil;
               return PoolPages(client, h.pool_id());
             }();
             Tensor t;
             t.owner = h.clone_handle();
             t.data = v.base;
             t.dtype = ToDLDataType(v.layout.format());
             t.device = v.device < 0 ? DLDevice{kDLCPU, 0} : DLDevice{kDLCUDA, v.device};
             if (v.layout.ScaleBytes() == 0) {
               t.shape = {pages, 2, v.layout.page_size, v.layout.num_kv_heads, v.layout.head_dim};
             } else {  // token rows of codes then scales: [pages, 2, page_size, row bytes]
               t.shape = {pages, 2, v.layout.page_size, int64_t(v.layout.TokenBytes())};
             }
             return t;
           })
      .def("pool_scales", [](py::object self) {
        const H& h = self.cast<const H&>();
        const PageLayout l = h.layout();
        if (ScalesOf(l.format()) == KvScales::kPerHead) {  // fp8: the static scales
          auto owned = [&](const std::vector<float>& s) {
            return FromTensorOut(TensorOut{
                DType::kFloat32,
                {h.num_layers(), h.num_kv_heads()},
                std::string(reinterpret_cast<const char*>(s.data()), s.size() * sizeof(float))});
          };
          return py::make_tuple(owned(h.k_scales()), owned(h.v_scales()));
        }
        if (ScalesOf(l.format()) != KvScales::kPerToken)
          return py::make_tuple(py::none(), py::none());
        if (l.ValueBytes() % sizeof(float) != 0) {
          throw StatusError(absl::FailedPreconditionError(absl::StrCat(
              "pool_scales: token rows of ", l.num_kv_heads, " x ", l.head_dim,
              " codes leave the float32 scales unaligned; read them through pool_view() at "
              "ValueBytes() + 4 h of each row")));
        }
        py::object view = self.attr("pool_view")();  // owns the mapping, checks the cache
        const Tensor& pool = view.cast<const Tensor&>();
        const int64_t row = int64_t(l.TokenBytes() / sizeof(float));  // in floats
        auto scales = [&](int kv) {
          Tensor t = pool;
          t.data = static_cast<uint8_t*>(pool.data) + size_t(kv) * l.page_size * l.TokenBytes() +
                   l.ValueBytes();
          t.dtype = DLDataType{kDLFloat, 32, 1};
          t.shape = {pool.shape[0], l.page_size, l.num_kv_heads};
          t.strides = {2 * l.page_size * row, row, 1};
          return t;
        };
        return py::make_tuple(scales(0), scales(1));
      });

  client
      .def(
          "reserve",
          [](Client& c, const CacheTokenList& items) {
            Blocking([&] { return c.Reserve(items); });
          },
          py::arg("items"))
      .def(
          "commit",
          [](Client& c, const CacheTokenList& items) { Blocking([&] { return c.Commit(items); }); },
          py::arg("items"))
      .def(
          "decode_batch",
          [](Client&, std::vector<std::shared_ptr<H>> caches, int64_t tokens_per_step,
             int64_t max_blocks) {
            if (caches.empty() || !caches.front()) ThrowInvalid("decode_batch: no caches");
            DecodeBatchOptions o;
            o.tokens_per_step = tokens_per_step;
            o.max_blocks = max_blocks;
            auto b = std::make_unique<PyDecodeBatch>();
            b->geometry = Geometry::Of(*caches.front());
            b->batch = Blocking([&] { return DecodeBatch::Create(std::move(caches), o); });
            return b;
          },
          py::arg("caches"), py::arg("tokens_per_step") = 1, py::arg("max_blocks") = 0);

  m.def(
      "vllm_block_tables",
      [](const CacheTokenList& items, int layer, int64_t max_blocks, int32_t pad, py::handle like) {
        VllmBlockTables t =
            Blocking([&] { return BuildVllmBlockTables(items, layer, max_blocks, pad); });
        const int64_t n = int64_t(t.seq_lens.size());
        py::dict d;
        d["max_blocks"] = t.max_blocks;
        d["block_tables"] =
            TableLike(like, FromVector(std::move(t.block_tables), {n, t.max_blocks}));
        d["seq_lens"] = TableLike(like, FromVector(std::move(t.seq_lens), {n}));
        d["first_pos"] = TableLike(like, FromVector(std::move(t.first_pos), {n}));
        const int64_t q = int64_t(t.query_start_loc.size()), s = int64_t(t.slot_mapping.size());
        d["query_start_loc"] = TableLike(like, FromVector(std::move(t.query_start_loc), {q}));
        d["slot_mapping"] = TableLike(like, FromVector(std::move(t.slot_mapping), {s}));
        return Namespace(d);
      },
      py::arg("items"), py::arg("layer"), py::arg("max_blocks") = 0, py::arg("pad") = kPadBlockId,
      py::arg("like") = py::none());
  m.def(
      "flashinfer_page_table",
      [](const CacheTokenList& items, int layer, py::handle like) {
        FlashInferPageTable t = Blocking([&] { return BuildFlashInferPageTable(items, layer); });
        const int64_t n = int64_t(t.last_page_len.size()), i = int64_t(t.indices.size());
        py::dict d;
        d["indptr"] = TableLike(like, FromVector(std::move(t.indptr), {n + 1}));
        d["indices"] = TableLike(like, FromVector(std::move(t.indices), {i}));
        d["last_page_len"] = TableLike(like, FromVector(std::move(t.last_page_len), {n}));
        d["first_pos"] = TableLike(like, FromVector(std::move(t.first_pos), {n}));
        return Namespace(d);
      },
      py::arg("items"), py::arg("layer"), py::arg("like") = py::none());

  BindDecodeBatch(m);
}

}  // namespace kvarena::python
