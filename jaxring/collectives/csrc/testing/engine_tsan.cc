// The device engine's host side with played kernels (engine_fake.h) under
// ThreadSanitizer, for tests/jaxring/collectives/test_engines_tsan.py:
// executions started in shuffled orders on the ranks, several in flight per
// rank, fewer sessions than executions in flight, both paths; every sum is
// checked against a double-precision one. Prints the wrong elements and the
// errors; exit status 1 if there are any.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "testing/engine_fake.h"

namespace jaxring {
namespace {

// Wrong elements plus failed calls of one case.
int64_t RunCase(std::mt19937& rng, int ranks, int in_flight, int max_sessions, int64_t elements, bool one_shot) {
  FakeCuda cuda(ranks, {});
  cuda.play_ = true;
  EngineOptions options;
  options.max_sessions = max_sessions;
  options.one_shot_max_bytes = [one_shot](int64_t) { return one_shot ? int64_t{1} << 40 : int64_t{0}; };
  DeviceEngine engine(&cuda, options);
  const int runs = 20;
  std::vector<float> x(runs * ranks * elements), out(x.size(), NAN);
  std::normal_distribution<float> normal;
  for (float& v : x) v = normal(rng);
  std::vector<int> devices(ranks);
  for (int r = 0; r < ranks; ++r) devices[r] = r;
  std::atomic<int64_t> failed{0};
  RunInOrders(ShuffledOrders(rng, ranks, runs, in_flight), in_flight, -1, [&](int64_t rank, int64_t run) {
    const RingCall call = MakeRingCall(CallKey{1000 + run, 1, 0}, Mode::kAllReduce, elements, ranks,
                                       rank, 20000, 1 << 20, xla::ffi::DataType::F32);
    float* at = out.data() + (run * ranks + rank) * elements;
    const DeviceRank me{x.data() + (run * ranks + rank) * elements, at, at, devices[rank], nullptr, 1000 + run};
    std::string error;
    engine.Run(call, me, devices, DevicePath::kAuto, &error);
    if (!error.empty()) {
      std::printf("run %lld rank %lld: %s\n", static_cast<long long>(run), static_cast<long long>(rank),
                  error.c_str());
      ++failed;
    }
  });
  cuda.Drain();
  int64_t wrong = 0;
  for (int run = 0; run < runs; ++run) {
    for (int64_t i = 0; i < elements; ++i) {
      double sum = 0;
      for (int r = 0; r < ranks; ++r) sum += x[(run * ranks + r) * elements + i];
      for (int r = 0; r < ranks; ++r) wrong += !(std::fabs(out[(run * ranks + r) * elements + i] - sum) <= 1e-4);
    }
  }
  return wrong + failed;
}

}  // namespace
}  // namespace jaxring

int main() {
  std::mt19937 rng(1);
  int64_t bad = 0;
  // (ranks, executions in flight per rank, max_sessions, elements, one-shot)
  for (const auto& [ranks, in_flight, sessions, elements, one_shot] :
       std::vector<std::tuple<int, int, int, int64_t, bool>>{
           {2, 3, 16, 1001, false}, {4, 4, 2, 4099, true}, {8, 2, 16, 333, false}, {3, 5, 1, 1001, false}}) {
    bad += jaxring::RunCase(rng, ranks, in_flight, sessions, elements, one_shot);
  }
  std::printf("%lld wrong elements or failed calls\n", static_cast<long long>(bad));
  return bad == 0 ? 0 : 1;
}
