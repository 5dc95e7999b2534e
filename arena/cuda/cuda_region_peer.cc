// Test helper for cuda_region_test: a second process that imports a CUDA region the test
// exported, checks the bytes the test wrote, and writes its own. Started with fork+exec
// (posix_spawn), never a bare fork, since the parent has initialised CUDA.
//
// Usage: cuda_region_peer KIND SIZE HEX_IPC_HANDLE EXPECT_BYTE WRITE_BYTE OFF:BYTES:FD...
//   FD >= 0: a piece to map (inherited fd), and a range to check; FD = -1: check only.
// Exits 0 when every range read back EXPECT_BYTE (and now holds WRITE_BYTE).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "arena/cuda/cuda_region.h"

namespace {

int Fail(const std::string& what) {
  std::fprintf(stderr, "cuda_region_peer: %s\n", what.c_str());
  return 1;
}

std::string Unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(char(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 7) return Fail("usage: KIND SIZE HEX_IPC_HANDLE EXPECT WRITE OFF:BYTES:FD...");
  const std::string kind = argv[1];
  const size_t size = std::stoull(argv[2]);
  const std::string handle = std::string(argv[3]) == "-" ? "" : Unhex(argv[3]);
  const int expect = std::stoi(argv[4]), write = std::stoi(argv[5]);
  std::vector<kvarena::SharedPiece> pieces, ranges;
  for (int i = 6; i < argc; ++i) {
    kvarena::SharedPiece p;
    if (std::sscanf(argv[i], "%zu:%zu:%d", &p.offset, &p.bytes, &p.fd) != 3) return Fail(argv[i]);
    ranges.push_back(p);
    if (p.fd >= 0) pieces.push_back(p);
  }
  const std::optional<kvarena::RegionKind> parsed = kvarena::ParseRegionKind(kind);
  if (!parsed.has_value()) return Fail("unknown region kind " + kind);
  auto mapped = kvarena::ImportCudaRegion(*parsed, size, handle);
  if (!mapped.ok()) return Fail(mapped.status().ToString());
  if (auto s = (*mapped)->MapPieces(pieces); !s.ok()) return Fail(s.ToString());
  for (const kvarena::SharedPiece& r : ranges) {
    std::vector<unsigned char> host(r.bytes);
    uint8_t* at = (*mapped)->base() + r.offset;
    if (cudaMemcpy(host.data(), at, r.bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
      return Fail("cudaMemcpy");
    for (size_t i = 0; i < r.bytes; ++i) {
      if (host[i] != expect)
        return Fail("byte " + std::to_string(r.offset + i) + " = " + std::to_string(host[i]));
    }
    if (cudaMemset(at, write, r.bytes) != cudaSuccess) return Fail("cudaMemset");
  }
  if (cudaDeviceSynchronize() != cudaSuccess) return Fail("cudaDeviceSynchronize");
  return 0;
}
