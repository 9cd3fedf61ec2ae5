// CPU handler of the ring collectives: a real ring across the host-device
// threads that XLA runs one per device. Each rank reads only its left
// neighbour's buffers, as a GPU rank reads its neighbour over peer access.
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <string>

#include "xla/ffi/api/ffi.h"

#include "rendezvous.h"
#include "host_elementwise.h"
#include "ring_handler_common.h"
#include "ring_protocol.h"
#include "ring_schedule.h"

namespace jaxring {
namespace {

namespace ffi = xla::ffi;

template <typename T, typename Acc>
std::string RunRing(const RingCall& call, RankBuffers& me) {
  RendezvousHandle rendezvous(call.key, call.ranks, call.rank);
  if (!rendezvous.join_error().empty()) return rendezvous.join_error();
  const auto deadline = DeadlineFor(call.timeout_ms);
  if (auto error = rendezvous->Arrive(call.rank, &me, deadline); !error.empty()) {
    return error;
  }
  const int64_t left_rank = Mod(call.rank - 1, call.ranks);
  const int64_t right_rank = Mod(call.rank + 1, call.ranks);
  const RankBuffers& left = *static_cast<RankBuffers*>(rendezvous->state(left_rank));
  HostElementwise ew;
  const auto stages = BuildSchedule(call.mode, call.elements, call.ranks,
                                    call.rank, call.slice_elements, call.align);
  for (const Stage& st : stages) {
    if (auto e = rendezvous->WaitFor(left_rank, st.wait_left, deadline); !e.empty()) return e;
    if (auto e = rendezvous->WaitFor(right_rank, st.wait_right, deadline); !e.empty()) return e;
    RunStagePiece<T, Acc>(st, 0, st.count, me, left, ew);
    rendezvous->Advance(call.rank);
  }
  // XLA may reuse our buffers once we return: wait until the right
  // neighbour has read everything it reads from them.
  return rendezvous->WaitFor(right_rank, FinalWaitRight(stages), deadline);
}

std::string RunRingOf(ffi::DataType type, const RingCall& call, RankBuffers& me) {
  switch (type) {
    case ffi::DataType::F32:
      return RunRing<float, float>(call, me);
    case ffi::DataType::BF16:
      return RunRing<Bf16, float>(call, me);
    case ffi::DataType::F16:
      return RunRing<_Float16, float>(call, me);
    case ffi::DataType::S32:
      return RunRing<int32_t, int32_t>(call, me);
    default:
      return "jaxring: unsupported dtype";
  }
}

// Threads that run the ranks. A rank waits for its peers, possibly until the
// timeout, so it must not hold one of XLA's worker threads: XLA may run
// several independent collectives of one program at once and in different
// orders on different devices, and ranks blocking XLA's few threads (2 cores
// here) would wait on each other. Every queued task gets a thread at once (an
// idle one, else a new one), so no rank ever waits for a thread.
class RankThreads {
 public:
  void Run(std::function<void()> task) {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
    if (static_cast<int64_t>(tasks_.size()) > idle_) {
      std::thread([this] { Serve(); }).detach();
    } else {
      wake_.notify_one();
    }
  }

 private:
  void Serve() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      ++idle_;
      wake_.wait(lock, [&] { return !tasks_.empty(); });
      --idle_;
      auto task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> tasks_;
  int64_t idle_ = 0;
};

RankThreads& Threads() {
  static auto* threads = new RankThreads();  // never destroyed: its threads outlive main
  return *threads;
}

// Asynchronous: returns at once and completes the future when the rank is
// done, so XLA's thread is free to run this device's other work meanwhile.
ffi::Future RingCpu(ffi::RunId run_id, int32_t device_ordinal, ffi::AnyBuffer x,
                    ffi::Result<ffi::AnyBuffer> out,
                    ffi::Result<ffi::AnyBuffer> workspace, int64_t op_id,
                    int64_t mode, int64_t elements,
                    ffi::Span<const int64_t> ring_devices, int64_t ring_size,
                    int64_t timeout_ms, int64_t slice_bytes) {
  ffi::Promise promise;
  ffi::Future future(promise);
  RingCall call;
  if (auto error = DescribeCall(run_id.run_id, device_ordinal, op_id, mode,
                                elements, ring_devices, ring_size, timeout_ms,
                                slice_bytes, x.element_type(), &call);
      !error.empty()) {
    promise.SetError(ffi::Error::InvalidArgument(error));
    return future;
  }
  const WorkspaceLayout layout = WorkspaceFor(call, x.element_type(), /*staging_slice=*/false);
  if (auto error = CheckWorkspace(layout, workspace->element_count()); !error.empty()) {
    promise.SetError(ffi::Error::InvalidArgument(error));
    return future;
  }
  RankBuffers me{x.untyped_data(), out->untyped_data(),
                 layout.partial_sums > 0 ? workspace->untyped_data() : out->untyped_data()};
  Threads().Run([type = x.element_type(), call, me, promise]() mutable {
    const std::string error = RunRingOf(type, call, me);
    if (error.empty()) {
      promise.SetAvailable();
    } else {
      promise.SetError(ffi::Error::Internal(error));
    }
  });
  return future;
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kRingCpu, RingCpu,
                              JAXRING_RING_BINDING(ffi::Ffi::Bind()));

}  // namespace jaxring
