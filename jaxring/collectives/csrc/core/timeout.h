// The process-wide timeout of every meeting and wait of the handlers.
#pragma once

#include <chrono>
#include <cstdint>

namespace jaxring {

using Clock = std::chrono::steady_clock;

// Default timeout, in seconds (infinity: no limit); set from Python, which
// owns its value (jaxring/collectives/timeout.py).
double DefaultTimeoutSeconds();
void SetDefaultTimeoutSeconds(double seconds);
// What "no limit" waits at most: about 31 years, within the clock's range.
inline constexpr double kForeverSeconds = 1e9;
// The seconds a call with `timeout_ms` waits at most: > 0 that many
// milliseconds, 0 the default, < 0 none (kForeverSeconds).
double TimeoutSecondsFor(int64_t timeout_ms);
// The deadline of a call with `timeout_ms`: TimeoutSecondsFor(timeout_ms) from now.
Clock::time_point DeadlineFor(int64_t timeout_ms);

}  // namespace jaxring
