// The Redis tier's store against a running Redis Cluster (bench/redis_tier.sh starts one):
// chunks of --value_bytes written once, written again (found present: nothing sent), read
// one at a time (latency percentiles) and in pipelined batches of --batch (GetMany). Prints
// a table; times are measured, never checked.
//
//   redis_tier_bench --seeds=HOST:PORT[,...] [--value_bytes=1048576] [--chunks=256]
//                    [--batch=16]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tiers/redis/redis_store.h"

namespace kvarena {
namespace {

struct Args {
  std::string seeds;
  int64_t value_bytes = 1 << 20;
  int64_t chunks = 256;
  int64_t batch = 16;
};

bool ParseArgs(int argc, char** argv, Args* args) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    const std::string name = a.substr(0, eq),
                      value = eq == std::string::npos ? "" : a.substr(eq + 1);
    int64_t* number = name == "--value_bytes" ? &args->value_bytes
                      : name == "--chunks"    ? &args->chunks
                      : name == "--batch"     ? &args->batch
                                              : nullptr;
    if (name == "--seeds") {
      args->seeds = value;
    } else if (number == nullptr || !absl::SimpleAtoi(value, number) || *number < 1) {
      std::fprintf(stderr, "redis_tier_bench: bad argument %s\n", a.c_str());
      return false;
    }
  }
  return !args->seeds.empty();
}

void Row(const char* what, int64_t ops, int64_t bytes, absl::Duration took) {
  const double s = absl::ToDoubleSeconds(took);
  std::printf("%-34s %8lld ops %10.0f ops/s %9.1f MB/s\n", what, static_cast<long long>(ops),
              ops / s, bytes / s / 1e6);
}

int Run(const Args& args) {
  RedisStoreOptions options;
  options.seeds = args.seeds;
  options.command_timeout = absl::Seconds(5);
  absl::StatusOr<std::unique_ptr<RedisStore>> store = RedisStore::Create(options);
  if (!store.ok()) {
    std::fprintf(stderr, "redis_tier_bench: %s\n", store.status().ToString().c_str());
    return 1;
  }
  std::vector<ChunkKey> keys;
  const uint64_t run = uint64_t(absl::ToUnixNanos(absl::Now()));  // fresh keys each run
  for (int64_t i = 0; i < args.chunks; ++i) keys.push_back({run, uint64_t(i)});
  std::string value(size_t(args.value_bytes), '\0');
  for (size_t i = 0; i < value.size(); ++i) value[i] = char(i * 131 % 251);
  const int64_t total = args.chunks * args.value_bytes;
  std::printf("%lld chunks of %lld bytes; seeds %s\n", static_cast<long long>(args.chunks),
              static_cast<long long>(args.value_bytes), args.seeds.c_str());

  struct Pass {
    const char* name;
    int64_t bytes_sent;
  };
  for (const Pass pass : {Pass{"Put (EXISTS + SET)", total}, Pass{"Put again (EXISTS only)", 0}}) {
    const absl::Time start = absl::Now();
    for (const ChunkKey& k : keys) {
      if (absl::Status s = (*store)->Put(k, value, nullptr); !s.ok()) {
        std::fprintf(stderr, "redis_tier_bench: Put: %s\n", s.ToString().c_str());
        return 1;
      }
    }
    Row(pass.name, args.chunks, pass.bytes_sent, absl::Now() - start);
  }

  std::vector<double> micros;
  absl::Time start = absl::Now();
  for (const ChunkKey& k : keys) {
    const absl::Time t = absl::Now();
    absl::StatusOr<std::string> got = (*store)->Get(k, t + absl::Seconds(5));
    micros.push_back(absl::ToDoubleMicroseconds(absl::Now() - t));
    if (!got.ok() || got->size() != value.size()) {
      std::fprintf(stderr, "redis_tier_bench: Get: %s\n", got.status().ToString().c_str());
      return 1;
    }
  }
  Row("Get, one at a time", args.chunks, total, absl::Now() - start);
  std::sort(micros.begin(), micros.end());
  std::printf("%-34s p50 %.0f us, p99 %.0f us\n", "  Get latency", micros[micros.size() / 2],
              micros[std::min(micros.size() - 1, micros.size() * 99 / 100)]);

  start = absl::Now();
  for (size_t i = 0; i < keys.size(); i += size_t(args.batch)) {
    const std::vector<ChunkKey> batch(keys.begin() + i,
                                      keys.begin() + std::min(keys.size(), i + size_t(args.batch)));
    for (const absl::StatusOr<std::string>& got :
         (*store)->GetMany(batch, absl::Now() + absl::Seconds(30))) {
      if (!got.ok()) {
        std::fprintf(stderr, "redis_tier_bench: GetMany: %s\n", got.status().ToString().c_str());
        return 1;
      }
    }
  }
  Row(absl::StrCat("GetMany, batches of ", args.batch).c_str(), args.chunks, total,
      absl::Now() - start);
  for (const ChunkKey& k : keys) (*store)->Erase(k);
  return 0;
}

}  // namespace
}  // namespace kvarena

int main(int argc, char** argv) {
  kvarena::Args args;
  if (!kvarena::ParseArgs(argc, argv, &args)) {
    std::fprintf(stderr,
                 "usage: redis_tier_bench --seeds=HOST:PORT[,...] [--value_bytes=N] "
                 "[--chunks=N] [--batch=N]\n");
    return 2;
  }
  return kvarena::Run(args);
}
