// The smallest worker: connects (argv[1], default inproc:), allocates a cache, appends one
// token's K/V, attends and reads it back; prints "installed_worker: ok" and exits 0, or the
// error and exits 1.
#include <cstdio>
#include <vector>

#include "kvarena/client.h"

int main(int argc, char** argv) {
  const char* address = argc > 1 ? argv[1] : kvarena::kInprocAddress;
  auto client = kvarena::Client::Connect(address);
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  kvarena::CacheSpec spec;
  spec.num_layers = 1;
  spec.num_kv_heads = 1;
  spec.head_dim = 4;
  spec.dtype = kvarena::DType::kFloat32;
  auto cache = (*client)->Allocate(spec);
  if (!cache.ok()) {
    std::fprintf(stderr, "allocate: %s\n", cache.status().ToString().c_str());
    return 1;
  }
  std::vector<float> x = {1, 2, 3, 4};
  const kvarena::TensorArg t{kvarena::DType::kFloat32, {1, 1, 1, 4}, x.data(), x.size() * 4};
  auto out = (*cache)->attention(0, t, t, t);
  auto kv = (*cache)->get_kv(0);
  if (!out.ok() || !kv.ok()) {
    std::fprintf(stderr, "attention / get_kv failed\n");
    return 1;
  }
  const float* got = reinterpret_cast<const float*>(out->data.data());
  for (int i = 0; i < 4; ++i) {
    if (got[i] != x[size_t(i)]) {  // one key: attention returns its value
      std::fprintf(stderr, "out[%d] = %g, want %g\n", i, got[i], x[size_t(i)]);
      return 1;
    }
  }
  std::printf("installed_worker: ok (%s, %lld tokens)\n", address,
              static_cast<long long>((*cache)->num_tokens()));
  return 0;
}
