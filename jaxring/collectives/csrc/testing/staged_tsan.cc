// The host-staged engine's meeting and walk through the schedule (host_staged.h)
// under ThreadSanitizer, for tests/jaxring/collectives/test_engines_tsan.py:
// executions started in shuffled orders on the ranks, several in flight per
// rank, each run two calls of the op; every sum is checked against a
// double-precision one. Prints the wrong elements and the errors; exit status
// 1 if there are any.
#include <atomic>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "testing/execution_orders.h"
#include "testing/host_staged.h"

namespace jaxring {
namespace {

// Wrong elements plus failed calls of one case.
int64_t RunCase(std::mt19937& rng, int64_t op_id, int ranks, int in_flight, int64_t elements) {
  const int runs = 20, occurrences = 2;
  std::vector<float> x(runs * occurrences * ranks * elements), out(x.size(), NAN);
  std::normal_distribution<float> normal;
  for (float& v : x) v = normal(rng);
  std::atomic<int64_t> failed{0};
  RunInOrders(ShuffledOrders(rng, ranks, runs, in_flight), in_flight, -1, [&](int64_t rank, int64_t run) {
    for (int64_t k = 0; k < occurrences; ++k) {
      const RingCall call = MakeRingCall(CallKey{1000 + run, op_id, 0}, Mode::kAllReduce, elements, ranks, rank,
                                         20000, 256, xla::ffi::DataType::F32);
      const int64_t at = ((run * occurrences + k) * ranks + rank) * elements;
      if (const std::string error = RunHostStaged(call, x.data() + at, out.data() + at); !error.empty()) {
        std::printf("run %lld rank %lld: %s\n", static_cast<long long>(run), static_cast<long long>(rank),
                    error.c_str());
        ++failed;
      }
    }
  });
  int64_t wrong = 0;
  for (int64_t call = 0; call < runs * occurrences; ++call) {
    for (int64_t i = 0; i < elements; ++i) {
      double sum = 0;
      for (int r = 0; r < ranks; ++r) sum += x[(call * ranks + r) * elements + i];
      for (int r = 0; r < ranks; ++r) wrong += !(std::fabs(out[(call * ranks + r) * elements + i] - sum) <= 1e-4);
    }
  }
  return wrong + failed;
}

}  // namespace
}  // namespace jaxring

int main() {
  std::mt19937 rng(1);
  int64_t bad = 0, op_id = 1;
  // (ranks, executions in flight per rank, elements)
  for (const auto& [ranks, in_flight, elements] :
       std::vector<std::tuple<int, int, int64_t>>{{2, 3, 1001}, {4, 4, 4099}, {8, 2, 333}, {3, 5, 1001}}) {
    bad += jaxring::RunCase(rng, op_id++, ranks, in_flight, elements);
  }
  std::printf("%lld wrong elements or failed calls\n", static_cast<long long>(bad));
  return bad == 0 ? 0 : 1;
}
