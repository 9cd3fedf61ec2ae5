#include "core/timeout.h"

#include <algorithm>
#include <atomic>
#include <limits>

namespace jaxring {
namespace {

// Python sets it when it loads the module (jaxring/collectives/timeout.py owns the
// default and the JAXRING_TIMEOUT_S rules); until then, no limit.
std::atomic<double>& DefaultTimeout() {
  static std::atomic<double> seconds{std::numeric_limits<double>::infinity()};
  return seconds;
}

}  // namespace

double DefaultTimeoutSeconds() { return DefaultTimeout().load(); }
void SetDefaultTimeoutSeconds(double seconds) { DefaultTimeout().store(seconds); }

double TimeoutSecondsFor(int64_t timeout_ms) {
  const double seconds = timeout_ms > 0 ? timeout_ms / 1000.0 : timeout_ms < 0 ? kForeverSeconds : DefaultTimeoutSeconds();
  // An infinite duration would overflow the clock's ticks; ~31 years will not.
  return std::min(seconds, kForeverSeconds);
}

Clock::time_point DeadlineFor(int64_t timeout_ms) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(TimeoutSecondsFor(timeout_ms)));
}

}  // namespace jaxring
