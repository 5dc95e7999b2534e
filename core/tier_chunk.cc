#include "core/tier_chunk.h"

#include <xxhash.h>

#include <algorithm>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "base/checked.h"
#include "base/little_endian.h"
#include "base/status_macros.h"

namespace kvarena {
namespace {

constexpr absl::string_view kMagic = "KVACHNK1";
// The keys' domain names the format version, so chunks of another version never share a
// key with this one's.
const std::string& KeyDomain() {
  static const std::string* domain =
      new std::string(absl::StrCat("kvarena.chunk.v", kChunkFormatVersion));
  return *domain;
}
constexpr size_t kChecksumBytes = 8;

// Sum over layers of (P - first_page[l]) pages of page_bytes; nullopt when an entry is
// outside [0, P] or the sum does not fit in 64 bits.
std::optional<uint64_t> PayloadBytes(uint64_t page_bytes, int64_t chunk_pages,
                                     const std::vector<int32_t>& first_page) {
  uint64_t pages = 0;
  for (int32_t f : first_page) {
    if (f < 0 || f > chunk_pages) return std::nullopt;
    std::optional<uint64_t> sum = CheckedAdd(pages, uint64_t(chunk_pages - f));
    if (!sum) return std::nullopt;
    pages = *sum;
  }
  return CheckedMul(pages, page_bytes);
}

absl::Status Mismatch(absl::string_view field, uint64_t got, uint64_t want) {
  return absl::DataLossError(absl::StrCat("tier chunk: ", field, " is ", got, ", want ", want));
}

// A cursor over an untrusted value: every read checks the bytes are there first.
class Reader {
 public:
  explicit Reader(absl::string_view v) : v_(v) {}

  absl::Status Bytes(absl::string_view field, uint64_t n, absl::string_view* out) {
    if (n > v_.size() - pos_) {
      return absl::DataLossError(absl::StrCat("tier chunk: truncated at ", field, ": needs ", n,
                                              " bytes at offset ", pos_, ", value has ",
                                              v_.size()));
    }
    *out = v_.substr(pos_, n);
    pos_ += n;
    return absl::OkStatus();
  }
  absl::Status U32(absl::string_view field, uint32_t* out) {
    absl::string_view b;
    KVARENA_RETURN_IF_ERROR(Bytes(field, 4, &b));
    *out = LoadU32(b.data());
    return absl::OkStatus();
  }
  absl::Status U64(absl::string_view field, uint64_t* out) {
    absl::string_view b;
    KVARENA_RETURN_IF_ERROR(Bytes(field, 8, &b));
    *out = LoadU64(b.data());
    return absl::OkStatus();
  }
  // A u32 that must equal want.
  absl::Status ExpectU32(absl::string_view field, uint64_t want) {
    uint32_t got = 0;
    KVARENA_RETURN_IF_ERROR(U32(field, &got));
    return got == want ? absl::OkStatus() : Mismatch(field, got, want);
  }
  // A u32 length and that many bytes, which must equal want.
  absl::Status ExpectString(absl::string_view field, absl::string_view want) {
    uint32_t len = 0;
    absl::string_view got;
    KVARENA_RETURN_IF_ERROR(U32(absl::StrCat("len(", field, ")"), &len));
    KVARENA_RETURN_IF_ERROR(Bytes(field, len, &got));
    if (got == want) return absl::OkStatus();
    return absl::DataLossError(
        absl::StrCat("tier chunk: ", field, " is ", Quoted(got), ", want ", Quoted(want)));
  }
  absl::Status ExpectHash(absl::string_view field, const Hash128& want) {
    Hash128 got;
    KVARENA_RETURN_IF_ERROR(U64(field, &got.low));
    KVARENA_RETURN_IF_ERROR(U64(field, &got.high));
    if (got == want) return absl::OkStatus();
    return absl::DataLossError(
        absl::StrCat("tier chunk: ", field, " is ", got.Hex(), ", want ", want.Hex()));
  }
  // The magic and the format version every chunk starts with.
  absl::Status MagicAndVersion() {
    absl::string_view magic;
    KVARENA_RETURN_IF_ERROR(Bytes("magic", kMagic.size(), &magic));
    if (magic != kMagic) {
      return absl::DataLossError(
          absl::StrCat("tier chunk: magic is ", Quoted(magic), ", want ", Quoted(kMagic)));
    }
    return ExpectU32("format version", kChunkFormatVersion);
  }
  size_t pos() const { return pos_; }
  size_t left() const { return v_.size() - pos_; }

 private:
  absl::string_view v_;
  size_t pos_ = 0;
};

// The fixed-size part of a chunk: magic, version, eight u32 layout fields, the scales
// digest, first_block, two string lengths, two hashes, the checksum.
constexpr size_t kFixedBytes = 8 + 4 + 8 * 4 + 8 + 8 + 2 * 4 + 2 * 16 + kChecksumBytes;

// A caller's `want` that no encoder could have written: the caller's bug, not the value's.
absl::Status CheckWant(const ChunkIdentity& want) {
  const std::optional<uint64_t> tokens = CheckedMul(uint64_t(std::max(want.chunk_pages, 0)),
                                                    uint64_t(std::max(want.layout.page_size, 0)));
  if (want.chunk_pages <= 0 || want.num_layers <= 0 || want.layout.PageBytes() == 0 || !tokens ||
      want.tokens.size() != *tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tier chunk: the identity to verify against is malformed: chunk_pages=", want.chunk_pages,
        " num_layers=", want.num_layers, " page_bytes=", want.layout.PageBytes(),
        " tokens=", want.tokens.size()));
  }
  return absl::OkStatus();
}

}  // namespace

ChunkKey ChunkIdentity::key() const { return ChunkKeyOf(tenant, chunk_pages, last_hash); }

ChunkKey ChunkKeyOf(absl::string_view tenant, int32_t chunk_pages, const Hash128& last_hash) {
  std::string b(KeyDomain());
  PutU32(&b, uint32_t(chunk_pages));
  PutU32(&b, uint32_t(tenant.size()));
  b.append(tenant.data(), tenant.size());
  PutU64(&b, last_hash.low);
  PutU64(&b, last_hash.high);
  const XXH128_hash_t h = XXH3_128bits(b.data(), b.size());
  return Hash128{h.low64, h.high64};
}

int32_t DefaultChunkPages(size_t page_bytes, int num_layers, size_t min_bytes) {
  if (page_bytes == 0 || num_layers <= 0) return 1;
  const std::optional<size_t> per_page = CheckedMul(page_bytes, size_t(num_layers));
  if (!per_page) return 1;  // one page is already more than any min_bytes
  const size_t pages = min_bytes / *per_page + (min_bytes % *per_page != 0 ? 1 : 0);
  return int32_t(std::clamp<size_t>(pages, 1, std::numeric_limits<int32_t>::max()));
}

size_t ChunkPayloadBytes(const ChunkIdentity& id, const std::vector<int32_t>& first_page) {
  return PayloadBytes(id.layout.PageBytes(), id.chunk_pages, first_page).value_or(0);
}

std::string EncodeChunk(const ChunkIdentity& id, const std::vector<int32_t>& first_page,
                        absl::string_view payload) {
  std::string b;
  b.reserve(kFixedBytes + id.tenant.size() + id.prefix_namespace.size() + 4 * id.tokens.size() +
            4 * first_page.size() + payload.size());
  b.append(kMagic.data(), kMagic.size());
  PutU32(&b, kChunkFormatVersion);
  for (int v : {int(id.layout.dtype), int(id.layout.format()), int(ScalesOf(id.layout.format())),
                id.layout.page_size, id.layout.num_kv_heads, id.layout.head_dim, int(id.num_layers),
                int(id.chunk_pages)}) {
    PutU32(&b, uint32_t(v));
  }
  PutU64(&b, id.scales_digest);
  PutU64(&b, uint64_t(id.first_block));
  for (const std::string* s : {&id.tenant, &id.prefix_namespace}) {
    PutU32(&b, uint32_t(s->size()));
    b.append(*s);
  }
  for (const Hash128* h : {&id.parent_hash, &id.last_hash}) {
    PutU64(&b, h->low);
    PutU64(&b, h->high);
  }
  for (int32_t t : id.tokens) PutU32(&b, uint32_t(t));
  for (int32_t f : first_page) PutU32(&b, uint32_t(f));
  b.append(payload.data(), payload.size());
  PutU64(&b, XXH3_64bits(b.data(), b.size()));
  return b;
}

const uint8_t* DecodedChunk::Page(const ChunkIdentity& id, int layer, int block) const {
  const size_t page_bytes = id.layout.PageBytes();
  size_t pages_before = 0;
  for (int l = 0; l < layer; ++l) pages_before += size_t(id.chunk_pages - first_page[l]);
  pages_before += size_t(block - first_page[layer]);
  return reinterpret_cast<const uint8_t*>(payload.data()) + pages_before * page_bytes;
}

absl::Status DecodeChunk(absl::string_view value, const ChunkIdentity& want, DecodedChunk* out) {
  KVARENA_RETURN_IF_ERROR(CheckWant(want));
  if (value.size() < kFixedBytes) {
    return absl::DataLossError(absl::StrCat("tier chunk: size is ", value.size(),
                                            " bytes, less than the ", kFixedBytes,
                                            " of an empty chunk"));
  }
  Reader r(value);
  KVARENA_RETURN_IF_ERROR(r.MagicAndVersion());
  KVARENA_RETURN_IF_ERROR(r.ExpectU32("dtype", uint32_t(want.layout.dtype)));
  KVARENA_RETURN_IF_ERROR(r.ExpectU32("kv_format", uint32_t(want.layout.format())));
  KVARENA_RETURN_IF_ERROR(r.ExpectU32("scales", uint32_t(ScalesOf(want.layout.format()))));
  KVARENA_RETURN_IF_ERROR(r.ExpectU32("page_size", uint32_t(want.layout.page_size)));
  KVARENA_RETURN_IF_ERROR(r.ExpectU32("num_kv_heads", uint32_t(want.layout.num_kv_heads)));
  KVARENA_RETURN_IF_ERROR(r.ExpectU32("head_dim", uint32_t(want.layout.head_dim)));
  KVARENA_RETURN_IF_ERROR(r.ExpectU32("num_layers", uint32_t(want.num_layers)));
  KVARENA_RETURN_IF_ERROR(r.ExpectU32("chunk_pages", uint32_t(want.chunk_pages)));
  uint64_t scales_digest = 0;
  KVARENA_RETURN_IF_ERROR(r.U64("scales_digest", &scales_digest));
  if (scales_digest != want.scales_digest) {
    return Mismatch("scales_digest", scales_digest, want.scales_digest);
  }
  uint64_t first_block = 0;
  KVARENA_RETURN_IF_ERROR(r.U64("first_block", &first_block));
  if (first_block != uint64_t(want.first_block)) {
    return Mismatch("first_block", first_block, uint64_t(want.first_block));
  }
  KVARENA_RETURN_IF_ERROR(r.ExpectString("tenant", want.tenant));
  KVARENA_RETURN_IF_ERROR(r.ExpectString("namespace", want.prefix_namespace));
  KVARENA_RETURN_IF_ERROR(r.ExpectHash("parent_hash", want.parent_hash));
  KVARENA_RETURN_IF_ERROR(r.ExpectHash("last_hash", want.last_hash));

  absl::string_view tokens;
  KVARENA_RETURN_IF_ERROR(r.Bytes("tokens", 4 * uint64_t(want.tokens.size()), &tokens));
  for (size_t i = 0; i < want.tokens.size(); ++i) {
    const int32_t got = int32_t(LoadU32(tokens.data() + 4 * i));
    if (got != want.tokens[i]) {
      return absl::DataLossError(
          absl::StrCat("tier chunk: token[", i, "] is ", got, ", want ", want.tokens[i]));
    }
  }
  std::vector<int32_t> first_page(size_t(want.num_layers));
  for (int l = 0; l < want.num_layers; ++l) {
    uint32_t f = 0;
    KVARENA_RETURN_IF_ERROR(r.U32("first_page", &f));
    if (f > uint32_t(want.chunk_pages)) {
      return absl::DataLossError(absl::StrCat("tier chunk: first_page[", l, "] is ", f,
                                              ", outside [0, ", want.chunk_pages, "]"));
    }
    first_page[size_t(l)] = int32_t(f);
  }
  const std::optional<uint64_t> payload_bytes =
      PayloadBytes(want.layout.PageBytes(), want.chunk_pages, first_page);
  const std::optional<uint64_t> rest =
      payload_bytes ? CheckedAdd(*payload_bytes, uint64_t{kChecksumBytes}) : std::nullopt;
  if (!rest || *rest != r.left()) {
    return absl::DataLossError(
        absl::StrCat("tier chunk: payload and checksum take ", r.left(), " bytes at offset ",
                     r.pos(), ", want ", rest ? absl::StrCat(*rest) : std::string("more than 2^64"),
                     " (", rest && *rest < r.left() ? "trailing bytes" : "truncated", ")"));
  }
  absl::string_view payload;
  KVARENA_RETURN_IF_ERROR(r.Bytes("payload", *payload_bytes, &payload));
  uint64_t checksum = 0;
  KVARENA_RETURN_IF_ERROR(r.U64("checksum", &checksum));
  const uint64_t computed = XXH3_64bits(value.data(), value.size() - kChecksumBytes);
  if (checksum != computed) {
    return absl::DataLossError(absl::StrCat("tier chunk: checksum is ", absl::Hex(checksum),
                                            ", the bytes hash to ", absl::Hex(computed)));
  }
  out->first_page = std::move(first_page);
  out->payload = payload;
  return absl::OkStatus();
}

absl::Status PeekChunk(absl::string_view value, ChunkIdentity* id,
                       std::vector<int32_t>* first_page) {
  Reader r(value);
  KVARENA_RETURN_IF_ERROR(r.MagicAndVersion());
  uint32_t f[8] = {};  // dtype, kv_format, scales (implied by kv_format), then as below
  for (uint32_t& x : f) KVARENA_RETURN_IF_ERROR(r.U32("geometry", &x));
  id->layout = PageLayout{DType(f[0]), int(f[3]), int(f[4]), int(f[5]), KvFormat(f[1])};
  id->num_layers = int32_t(f[6]);
  id->chunk_pages = int32_t(f[7]);
  KVARENA_RETURN_IF_ERROR(r.U64("scales_digest", &id->scales_digest));
  uint64_t first_block = 0;
  KVARENA_RETURN_IF_ERROR(r.U64("first_block", &first_block));
  id->first_block = int64_t(first_block);
  for (std::string* str : {&id->tenant, &id->prefix_namespace}) {
    uint32_t len = 0;
    absl::string_view b;
    KVARENA_RETURN_IF_ERROR(r.U32("string length", &len));
    KVARENA_RETURN_IF_ERROR(r.Bytes("string", len, &b));
    str->assign(b.data(), b.size());
  }
  for (Hash128* h : {&id->parent_hash, &id->last_hash}) {
    KVARENA_RETURN_IF_ERROR(r.U64("hash", &h->low));
    KVARENA_RETURN_IF_ERROR(r.U64("hash", &h->high));
  }
  // Sizes come from the value: read the bytes (bounded by its size) before allocating.
  absl::string_view tokens, firsts;
  KVARENA_RETURN_IF_ERROR(r.Bytes("tokens", 4 * uint64_t(f[7]) * uint64_t(f[3]), &tokens));
  KVARENA_RETURN_IF_ERROR(r.Bytes("first_page", 4 * uint64_t(f[6]), &firsts));
  id->tokens.resize(tokens.size() / 4);
  for (size_t i = 0; i < id->tokens.size(); ++i)
    id->tokens[i] = int32_t(LoadU32(tokens.data() + 4 * i));
  first_page->resize(firsts.size() / 4);
  for (size_t i = 0; i < first_page->size(); ++i) {
    (*first_page)[i] = int32_t(std::min<uint32_t>(LoadU32(firsts.data() + 4 * i), f[7]));
  }
  return absl::OkStatus();
}

}  // namespace kvarena
