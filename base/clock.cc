#include "base/clock.h"

namespace kvarena {
namespace {

class SystemClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

}  // namespace

Clock* RealClock() {
  static SystemClock* clock = new SystemClock();
  return clock;
}

}  // namespace kvarena
