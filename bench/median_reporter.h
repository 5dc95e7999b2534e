// A console reporter that also keeps every repetition's figures, and their medians, for
// the summary tables a benchmark prints after its runs. Not thread-safe (benchmark calls
// a reporter from one thread).
#ifndef KVARENA_BENCH_MEDIAN_REPORTER_H_
#define KVARENA_BENCH_MEDIAN_REPORTER_H_

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace kvarena::bench {

// Collects every repetition's GB/s and ms per call of each benchmark while printing as
// usual; the tables give the medians.
class TableReporter : public benchmark::ConsoleReporter {
 public:
  std::map<std::string, std::vector<double>> gbps;  // benchmark name -> GB/s per repetition
  std::map<std::string, std::vector<double>> ms;    // benchmark name -> ms per call
  // GB/s over the main thread's CPU time: what one thread reaches while it is on a core
  // (meaningful for threads:1 only), for a machine loaded by others.
  std::map<std::string, std::vector<double>> cpu_gbps;
  int repetitions = 0;
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.run_type != Run::RT_Iteration) continue;
      repetitions = std::max<int>(repetitions, int(run.repetitions));
      ms[run.benchmark_name()].push_back(run.GetAdjustedRealTime() / 1e3);  // runs are in µs
      auto it = run.counters.find("bytes_per_second");
      if (it == run.counters.end()) continue;
      gbps[run.benchmark_name()].push_back(double(it->second) / 1e9);
      const double cpu = run.GetAdjustedCPUTime();
      if (cpu > 0) {
        cpu_gbps[run.benchmark_name()].push_back(double(it->second) / 1e9 *
                                                 run.GetAdjustedRealTime() / cpu);
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }
};

// The median of a benchmark's repetitions (the mean of the middle two for an even count);
// 0 if it did not run.
inline double Median(const std::map<std::string, std::vector<double>>& m, const std::string& name) {
  auto it = m.find(name);
  if (it == m.end() || it->second.empty()) return 0;
  std::vector<double> v = it->second;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Prints x with the format, or "-" in the same width when it is 0 (not run).
inline void Cell(const char* format, int width, double x) {
  if (x == 0) {
    std::printf(" %*s", width, "-");
  } else {
    std::printf(format, x);
  }
}

}  // namespace kvarena::bench

#endif  // KVARENA_BENCH_MEDIAN_REPORTER_H_
