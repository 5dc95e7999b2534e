#include "tests/support/attention_reference.h"

#include <algorithm>
#include <cmath>

namespace kvarena::testing {

std::vector<double> ReferenceAttention(const ReferenceKv& kv, const double* q, int q_heads,
                                       int64_t n, int64_t q_pos, double scale, int64_t window) {
  const int dim = kv.head_dim;
  const int group = q_heads / kv.kv_heads;
  auto row = [&](const double* base, int64_t t, int h) {
    return base + (size_t(t - kv.first) * kv.kv_heads + h) * dim;
  };
  std::vector<double> out(size_t(q_heads) * n * dim, 0.0);
  std::vector<double> w;
  for (int h = 0; h < q_heads; ++h) {
    const int kh = h / group;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t p = q_pos + i;
      const int64_t lo = std::max(kv.first, window > 0 ? p - window + 1 : int64_t{0});
      const double* qv = q + (size_t(h) * n + i) * dim;
      w.assign(size_t(p - lo + 1), 0.0);
      double m = -INFINITY;
      for (int64_t t = lo; t <= p; ++t) {
        const double* k = row(kv.k, t, kh);
        double s = 0;
        for (int d = 0; d < dim; ++d) s += qv[d] * k[d];
        w[size_t(t - lo)] = s * scale;
        m = std::max(m, w[size_t(t - lo)]);
      }
      double sum = 0;
      for (double& x : w) sum += (x = std::exp(x - m));
      double* o = out.data() + (size_t(h) * n + i) * dim;
      for (int64_t t = lo; t <= p; ++t) {
        const double* v = row(kv.v, t, kh);
        const double wt = w[size_t(t - lo)] / sum;
        for (int d = 0; d < dim; ++d) o[d] += wt * v[d];
      }
    }
  }
  return out;
}

}  // namespace kvarena::testing
