// The CUDA engines' host sides without CUDA. The host-staged engine's meeting
// and schedule with its stages on host memory (MeetHostStaged), for
// tests/jaxring/collectives/test_staged_engine_executions.py. The device
// engine's host side (cuda/device_engine.h) over a fake CUDA, for
// tests/jaxring/collectives/test_device_engine.py: k ranks on k host
// threads call the engine as XLA's handler threads do; the fake records
// every CUDA call, keeps the kernel arguments of each launch, and can play
// a kernel that timed out, a buffer a peer cannot map, and the links. With
// `play`, each launch runs ring_protocol.h's lanes on a host thread of its
// own over the flags and buffers the engine gave it, as the kernel would
// (float32 data in host memory), so the tests check the sums of executions
// queued in any order (Fake::Queue).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <time.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <chrono>
#include <stdexcept>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "cuda/device_engine.h"
#include "testing/engine_fake.h"
#include "testing/host_staged.h"

namespace nb = nanobind;

namespace jaxring {
namespace {

using Values = nb::ndarray<float, nb::ndim<4>, nb::c_contig, nb::device::cpu>;

PeerLink LinkNamed(const std::string& name) {
  if (name == "nvlink") return PeerLink::kNvlink;
  if (name == "pcie") return PeerLink::kPcie;
  if (name == "none") return PeerLink::kNone;
  throw std::invalid_argument("link must be nvlink, pcie or none, got '" + name + "'");
}

// The host-staged CUDA engine without CUDA: its meeting (cuda/staged_meeting.h)
// and its walk through the schedule, the stages done on host memory. All-reduces
// x[run, occurrence, rank, :] over the ranks into out[run, occurrence, rank, :],
// each rank starting its runs in orders[rank] with up to `in_flight` unfinished
// (testing/execution_orders.h, `late_rank` there too); a run makes its calls
// one after the other. Returns the errors of the calls that failed.
std::vector<std::string> MeetHostStaged(Values x, Values out, std::vector<std::vector<int64_t>> orders,
                                        int64_t in_flight, int64_t timeout_ms, int64_t slice_bytes,
                                        int64_t late_rank, int64_t reduction) {
  static std::atomic<int64_t> op_ids{1LL << 41};  // apart from the other tests' ops
  const int64_t op_id = op_ids.fetch_add(1);
  const int64_t occurrences = x.shape(1), ranks = x.shape(2), elements = x.shape(3);
  std::mutex mu;  // guards errors
  std::vector<std::string> errors;
  nb::gil_scoped_release released;
  RunInOrders(orders, in_flight, late_rank, [&](int64_t rank, int64_t run) {
    for (int64_t k = 0; k < occurrences; ++k) {
      const RingCall call = MakeRingCall(CallKey{1000 + run, op_id, 0}, Mode::kAllReduce, elements, ranks, rank,
                                         timeout_ms, slice_bytes, xla::ffi::DataType::F32,
                                         static_cast<Reduction>(reduction));
      const int64_t at = ((run * occurrences + k) * ranks + rank) * elements;
      if (const std::string error = RunHostStaged(call, x.data() + at, out.data() + at); !error.empty()) {
        std::lock_guard<std::mutex> lock(mu);
        errors.push_back("rank " + std::to_string(rank) + " run " + std::to_string(run) + ": " + error);
      }
    }
  });
  return errors;
}

// A fake machine and the engine on it.
class Fake {
 public:
  Fake(int devices, const std::map<std::pair<int, int>, std::string>& links, bool any_link,
       int64_t pool_slots, int64_t one_shot_max_bytes, int64_t max_sessions, bool play)
      : cuda_(devices, [&] {
          std::map<std::pair<int, int>, PeerLink> parsed;
          for (const auto& [pair, name] : links) parsed[pair] = LinkNamed(name);
          return parsed;
        }()) {
    EngineOptions options;
    options.any_link = any_link;
    options.pool_slots = pool_slots;
    options.max_sessions = max_sessions;
    cuda_.play_ = play;
    options.one_shot_max_bytes = [one_shot_max_bytes](int64_t) { return one_shot_max_bytes; };
    options.log = [this](const std::string& line) { engine_log_.push_back(line); };  // under the engine's lock
    engine_ = std::make_unique<DeviceEngine>(&cuda_, options);
  }

  static uintptr_t Input(int64_t rank) { return 0x100000 * (rank + 1); }
  static uintptr_t Output(int64_t rank) { return Input(rank) + 0x1000; }

  // `calls` calls of one op by every rank but `absent_rank`, each rank on its
  // own thread, `late_rank`'s once the others' have returned; per call and
  // rank: (outcome, error).
  std::vector<std::vector<std::pair<std::string, std::string>>> Run(
      int64_t op_id, std::vector<int> devices, int64_t elements, int64_t calls, int64_t mode,
      int64_t timeout_ms, std::vector<int64_t> run_ids, int64_t absent_rank, int64_t late_rank) {
    const int64_t ranks = static_cast<int64_t>(devices.size());
    if (run_ids.empty()) run_ids.assign(ranks, 1);
    std::vector<std::vector<std::pair<std::string, std::string>>> results(
        calls, std::vector<std::pair<std::string, std::string>>(ranks));
    std::vector<int64_t> order;  // the late rank last
    for (int64_t r = 0; r < ranks; ++r) {
      if (r != absent_rank && r != late_rank) order.push_back(r);
    }
    if (late_rank >= 0) order.push_back(late_rank);
    nb::gil_scoped_release release;
    std::vector<std::thread> threads;
    for (int64_t r : order) {
      if (r == late_rank) {
        for (auto& t : threads) t.join();
        threads.clear();
      }
      threads.emplace_back([&, r] {
        const RingCall call = MakeRingCall(CallKey{run_ids[r], op_id, 0}, static_cast<Mode>(mode),
                                           elements, ranks, r, timeout_ms, 1 << 20, xla::ffi::DataType::F32);
        const DeviceRank me{reinterpret_cast<const void*>(Input(r)), reinterpret_cast<void*>(Output(r)),
                            reinterpret_cast<void*>(Output(r)), devices[r],
                            reinterpret_cast<void*>(r + 1), run_ids[r]};
        for (int64_t c = 0; c < calls; ++c) {
          std::string error;
          const auto outcome = engine_->Run(call, me, devices, DevicePath::kAuto, &error);
          results[c][r] = {outcome == DeviceEngine::Outcome::kLaunched      ? "launched"
                           : outcome == DeviceEngine::Outcome::kUseHostEngine ? "host engine"
                                                                              : "failed",
                           error};
        }
      });
    }
    for (auto& t : threads) t.join();
    return results;
  }

  // All-reduces x[run, occurrence, rank, :] over the ranks (devices 0..k-1)
  // into out[run, occurrence, rank, :], the runs started as RunInOrders plays
  // them; a run makes its calls (its occurrences, as a loop in the program
  // would) one after the other, each returning once launched, as XLA's
  // handler does. Once every played kernel has ended: the errors of the calls
  // that failed, then each rank's recorded device failure.
  std::vector<std::string> Queue(Values x, Values out, std::vector<std::vector<int64_t>> orders,
                                 int64_t in_flight, const std::string& path, int64_t timeout_ms,
                                 int64_t late_rank, int64_t reduction) {
    static std::atomic<int64_t> op_ids{1LL << 40};  // apart from the other tests' ops
    const int64_t op_id = op_ids.fetch_add(1);
    const int64_t occurrences = x.shape(1), ranks = x.shape(2), elements = x.shape(3);
    const DevicePath device_path = path == "ring"       ? DevicePath::kRing
                                   : path == "one_shot" ? DevicePath::kOneShot
                                                        : DevicePath::kAuto;
    std::vector<int> devices(ranks);
    for (int64_t r = 0; r < ranks; ++r) devices[r] = static_cast<int>(r);
    std::mutex mu;
    std::vector<std::string> errors;
    nb::gil_scoped_release released;
    RunInOrders(orders, in_flight, late_rank, [&](int64_t rank, int64_t run) {
      for (int64_t k = 0; k < occurrences; ++k) {
        const RingCall call = MakeRingCall(CallKey{1000 + run, op_id, 0}, Mode::kAllReduce, elements,
                                           ranks, rank, timeout_ms, 1 << 20, xla::ffi::DataType::F32,
                                           static_cast<Reduction>(reduction));
        float* at = out.data() + ((run * occurrences + k) * ranks + rank) * elements;
        const DeviceRank me{x.data() + ((run * occurrences + k) * ranks + rank) * elements, at, at,
                            devices[rank], reinterpret_cast<void*>(rank + 1), 1000 + run};
        std::string error;
        engine_->Run(call, me, devices, device_path, &error);
        if (!error.empty()) {
          std::lock_guard<std::mutex> lock(mu);
          errors.push_back("rank " + std::to_string(rank) + " run " + std::to_string(run) + ": " + error);
        }
      }
    });
    cuda_.Drain();
    for (int64_t rank = 0; rank < ranks; ++rank) {
      const RingCall call = MakeRingCall(CallKey{1, op_id, 0}, Mode::kAllReduce, elements, ranks,
                                         rank, timeout_ms, 1 << 20, xla::ffi::DataType::F32);
      if (std::string failure = engine_->TakeFailure(call, devices); !failure.empty()) {
        errors.push_back("rank " + std::to_string(rank) + " on the device: " + failure);
      }
    }
    return errors;
  }

  // Host nanoseconds per call per rank (the median rank) of `calls` calls
  // with launches that do nothing, after `calls` / 10 warm-up calls.
  // Median over ranks of (wall, this thread's CPU) nanoseconds per call.
  std::pair<double, double> TimeCalls(int64_t ranks, int64_t calls, int64_t op_id) {
    cuda_.keep_launches_ = false;
    std::vector<int> devices(ranks);
    for (int64_t r = 0; r < ranks; ++r) devices[r] = static_cast<int>(r);
    std::vector<double> wall(ranks), cpu(ranks);
    std::vector<std::string> errors(ranks);
    const auto thread_cpu_ns = [] {
      timespec t;
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
      return 1e9 * static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec);
    };
    {
      nb::gil_scoped_release release;
      std::vector<std::thread> threads;
      for (int64_t r = 0; r < ranks; ++r) {
        threads.emplace_back([&, r] {
          const RingCall call = MakeRingCall(CallKey{1, op_id, 0}, Mode::kAllReduce, 1024, ranks, r,
                                             60000, 1 << 20, xla::ffi::DataType::F32);
          const DeviceRank me{reinterpret_cast<const void*>(Input(r)), reinterpret_cast<void*>(Output(r)),
                              reinterpret_cast<void*>(Output(r)), devices[r],
                              reinterpret_cast<void*>(r + 1), 1};
          std::string error;
          for (int64_t c = 0; c < calls / 10 + 1; ++c) {
            engine_->Run(call, me, devices, DevicePath::kAuto, &error);
          }
          const auto start = std::chrono::steady_clock::now();
          const double start_cpu = thread_cpu_ns();
          for (int64_t c = 0; c < calls; ++c) {
            engine_->Run(call, me, devices, DevicePath::kAuto, &error);
          }
          cpu[r] = (thread_cpu_ns() - start_cpu) / calls;
          wall[r] = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() / calls;
          errors[r] = error;
        });
      }
      for (auto& t : threads) t.join();
    }
    cuda_.keep_launches_ = true;
    for (const std::string& e : errors) {
      if (!e.empty()) throw std::runtime_error(e);
    }
    std::sort(wall.begin(), wall.end());
    std::sort(cpu.begin(), cpu.end());
    return {wall[ranks / 2], cpu[ranks / 2]};
  }

  nb::list Launches() {
    nb::list out;
    std::lock_guard<std::mutex> lock(cuda_.mu_);
    for (const Launched& l : cuda_.launched_) {
      nb::dict d;
      d["rank"] = l.rank;
      d["epoch"] = l.epoch;
      d["lanes"] = l.lanes;
      d["one_shot"] = l.one_shot;
      d["flag_blocks"] = l.flag_blocks;
      d["inputs"] = l.inputs;
      d["blocks_done"] = l.blocks_done;
      d["blocks_done_after"] = l.blocks_done_after;
      out.append(d);
    }
    cuda_.launched_.clear();
    return out;
  }

  FakeCuda cuda_;
  std::vector<std::string> engine_log_;
  std::unique_ptr<DeviceEngine> engine_;
};

}  // namespace
}  // namespace jaxring

NB_MODULE(_jaxring_engine_test, m) {
  using jaxring::Fake;
  nb::class_<Fake>(m, "Fake")
      .def(nb::init<int, const std::map<std::pair<int, int>, std::string>&, bool, int64_t, int64_t, int64_t,
                    bool>(),
           nb::arg("devices"), nb::arg("links") = std::map<std::pair<int, int>, std::string>{},
           nb::arg("any_link") = false, nb::arg("pool_slots") = 64, nb::arg("one_shot_max_bytes") = 0,
           nb::arg("max_sessions") = 16, nb::arg("play") = false)
      .def("run", &Fake::Run, nb::arg("op_id"), nb::arg("devices"), nb::arg("elements") = 1000,
           nb::arg("calls") = 1, nb::arg("mode") = 0, nb::arg("timeout_ms") = 10000,
           nb::arg("run_ids") = std::vector<int64_t>{}, nb::arg("absent_rank") = -1, nb::arg("late_rank") = -1)
      .def("queue", &Fake::Queue, nb::arg("x"), nb::arg("out"), nb::arg("orders"), nb::arg("in_flight"),
           nb::arg("path") = "auto", nb::arg("timeout_ms") = 20000, nb::arg("late_rank") = -1,
           nb::arg("reduction") = 0,
           "All-reduces x[run, occurrence, rank] by `reduction` (core/reduction.h's value) into out over the ranks, each rank starting its runs in "
           "orders[rank], at most `in_flight` unfinished at a time; returns the errors (played kernels only).")
      .def("time_calls", &Fake::TimeCalls, nb::arg("ranks"), nb::arg("calls"), nb::arg("op_id"))
      .def("launches", &Fake::Launches, "Each launch since the last ask (and forgets them).")
      .def("cuda_calls", [](Fake& f) { std::lock_guard<std::mutex> l(f.cuda_.mu_); return f.cuda_.calls_; })
      .def("engine_log", [](Fake& f) { return f.engine_log_; })
      .def("pointer_queries", [](Fake& f) {
        std::lock_guard<std::mutex> l(f.cuda_.mu_);
        return f.cuda_.pointer_queries_;
      })
      .def("fail_on_device", [](Fake& f, int64_t rank, uint64_t epoch, int64_t peer) {
        std::lock_guard<std::mutex> l(f.cuda_.mu_);
        f.cuda_.fail_[{rank, epoch}] = peer;
        f.cuda_.any_fail_.store(true, std::memory_order_release);
      }, "The kernel of `rank` in call `epoch` times out waiting for `peer`.")
      .def("unreadable", [](Fake& f, uintptr_t ptr, int peer) {
        std::lock_guard<std::mutex> l(f.cuda_.mu_);
        f.cuda_.unreadable_.insert({ptr, peer});
      }, "Kernels on `peer` cannot read `ptr`.")
      .def("fail_setup", [](Fake& f, const std::string& what) { f.cuda_.fail_setup_ = what; })
      .def("take_failure", [](Fake& f, int64_t op_id, std::vector<int> devices, int64_t rank) {
        const auto call = jaxring::MakeRingCall(jaxring::CallKey{1, op_id, 0}, jaxring::Mode::kAllReduce, 1,
                                                static_cast<int64_t>(devices.size()), rank, 1000, 1 << 20,
                                                xla::ffi::DataType::F32);
        return f.engine_->TakeFailure(call, devices);
      });
  m.def("meet_host_staged", &jaxring::MeetHostStaged, nb::arg("x"), nb::arg("out"), nb::arg("orders"),
        nb::arg("in_flight"), nb::arg("timeout_ms") = 20000, nb::arg("slice_bytes") = 256, nb::arg("late_rank") = -1,
        nb::arg("reduction") = 0,
        "The host-staged engine's meeting and schedule (cuda/staged_meeting.h), stages on host memory: reduces "
        "x[run, occurrence, rank] by `reduction` (core/reduction.h's value) into out over the ranks, each rank starting its runs in orders[rank], at most "
        "`in_flight` unfinished at a time; returns the failed calls' errors.");
  m.def("input_address", &Fake::Input);
  m.def("output_address", &Fake::Output);
  m.attr("POOL_SLOT_BYTES") = jaxring::kSlotWords * sizeof(uint64_t);
  m.attr("MAX_LANES") = jaxring::kMaxLanes;
}
