// The CPU engine (cpu_engine.h) driven straight from host threads, for
// tests/jaxring/collectives/test_cpu_engine_executions.py: each rank runs its
// calls in an order the test chooses, several at once, so the test plays the
// orders an asynchronous runtime may start executions in (XLA's CPU client
// happens to start them one launch at a time; nothing in the engine may rely
// on that).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "core/ring_handler_common.h"
#include "cpu/cpu_engine.h"
#include "testing/execution_orders.h"
#include "xla/ffi/api/ffi.h"

namespace nb = nanobind;

namespace jaxring {
namespace {

using Values = nb::ndarray<float, nb::ndim<4>, nb::c_contig, nb::device::cpu>;

// Runs the all-reduce of x[run, occurrence, rank, :] over the ranks into
// out[run, occurrence, rank, :], each rank starting its runs in orders[rank]
// with up to `in_flight` unfinished (execution_orders.h, `late_rank` there
// too); a run makes its calls (its occurrences, as a loop in the program
// would) one after the other, each as the handler does (cpu/cpu_handler.cc: a short
// wait for the peers, then the call). Returns the errors of the calls that
// failed.
std::vector<std::string> Meet(Values x, Values out, std::vector<std::vector<int64_t>> orders,
                              int64_t in_flight, int64_t path, int64_t timeout_ms,
                              int64_t inline_wait_us, int64_t late_rank) {
  static std::atomic<int64_t> op_ids{1LL << 40};  // apart from every traced op's id
  const int64_t op_id = op_ids.fetch_add(1);
  const int64_t occurrences = x.shape(1), ranks = x.shape(2), elements = x.shape(3);
  std::vector<int64_t> devices(ranks);
  for (int64_t r = 0; r < ranks; ++r) devices[r] = r;
  const xla::ffi::Span<const int64_t> ring(devices.data(), devices.size());
  const int64_t slice_bytes = 4 << 20;
  SetCpuForcedPath(static_cast<CpuPath>(path));
  std::mutex mu;  // guards errors
  std::vector<std::string> errors;
  auto run_calls = [&](int64_t rank, int64_t run) {
    for (int64_t k = 0; k < occurrences; ++k) {
      RingCall call;
      DescribeCall(1000 + run, static_cast<int32_t>(rank), op_id, 0, elements, ring, ranks,
                   timeout_ms, slice_bytes, xla::ffi::DataType::F32, /*reduction=*/0, &call);
      const int64_t at = ((run * occurrences + k) * ranks + rank) * elements;
      RankBuffers me{x.data() + at, out.data() + at, out.data() + at};
      CpuCall rank_call(call, me, ring);
      rank_call.EveryoneArrivedWithin(std::chrono::microseconds(inline_wait_us));
      const std::string error = rank_call.Run();
      if (!error.empty()) {
        std::lock_guard<std::mutex> lock(mu);
        errors.push_back("rank " + std::to_string(rank) + " run " + std::to_string(run) + ": " + error);
      }
    }
  };
  {
    nb::gil_scoped_release released;
    RunInOrders(orders, in_flight, late_rank, run_calls);
  }
  SetCpuForcedPath(CpuPath::kAuto);
  return errors;
}

}  // namespace
}  // namespace jaxring

NB_MODULE(_jaxring_cpu_engine_test, m) {
  m.def("meet", &jaxring::Meet, nb::arg("x"), nb::arg("out"), nb::arg("orders"), nb::arg("in_flight"),
        nb::arg("path"), nb::arg("timeout_ms") = 20000, nb::arg("inline_wait_us") = 0,
        nb::arg("late_rank") = -1,
        "All-reduces x[run, occurrence, rank] into out over the ranks, each rank starting its runs "
        "in orders[rank], at most `in_flight` unfinished at a time; returns the failed calls' errors.");
}
