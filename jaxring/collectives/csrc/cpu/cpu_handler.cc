// CPU handler of the ring collectives: the CPU engine (cpu_engine.h), which
// runs ring_protocol.h across the host-device threads that XLA runs one per
// device. Each rank reads its peers' buffers in place, as a GPU rank reads
// its neighbour over peer access.
#include <chrono>
#include <memory>
#include <string>

#include "xla/ffi/api/ffi.h"

#include "core/huge_pages.h"
#include "core/ring_handler_common.h"
#include "core/task_threads.h"
#include "cpu/cpu_engine.h"

namespace jaxring {
namespace {

namespace ffi = xla::ffi;

// How long a handler waits on XLA's thread for its peers to arrive before a
// task thread takes the call. Host-device ranks arrive up to milliseconds
// apart on a busy machine, and a hand-off costs about as much as a small
// call (docs/PERFORMANCE.md: 100 us gave 1.0x psum at 4-256 KiB, 5 ms 1.1x).
constexpr auto kInlineWait = std::chrono::milliseconds(5);

// Asynchronous: finishes on XLA's thread when every rank arrives within
// kInlineWait, as lax.psum's rendezvous does; else returns and completes the
// future on a task thread, so that XLA's threads are never held longer
// (ranks may wait for their peers until the timeout, and two independent
// collectives may run in different orders on different devices:
// task_threads.h).
ffi::Future RingCpu(ffi::RunId run_id, int32_t device_ordinal, ffi::AnyBuffer x,
                    ffi::Result<ffi::AnyBuffer> out,
                    ffi::Result<ffi::AnyBuffer> workspace, int64_t op_id,
                    int64_t mode, int64_t elements,
                    ffi::Span<const int64_t> ring_devices, int64_t ring_size,
                    int64_t timeout_ms, int64_t slice_bytes, int64_t reduction) {
  ffi::Promise promise;
  ffi::Future future(promise);
  RingCall call;
  if (auto error = DescribeCall(run_id.run_id, device_ordinal, op_id, mode,
                                elements, ring_devices, ring_size, timeout_ms,
                                slice_bytes, x.element_type(), reduction, &call);
      !error.empty()) {
    promise.SetError(ffi::Error::InvalidArgument(error));
    return future;
  }
  const WorkspaceLayout layout = WorkspaceFor(call, x.element_type(), /*staging_slice=*/false);
  if (auto error = CheckWorkspace(layout, workspace->element_count()); !error.empty()) {
    promise.SetError(ffi::Error::InvalidArgument(error));
    return future;
  }
  AdviseHugePages(out->untyped_data(), out->size_bytes());
  RankBuffers me{x.untyped_data(), out->untyped_data(),
                 layout.partial_sums > 0 ? workspace->untyped_data() : out->untyped_data()};
  const ffi::Span<const int64_t> devices(ring_devices.begin() + call.key.group * call.ranks,
                                         static_cast<size_t>(call.ranks));
  auto rank_call = std::make_shared<CpuCall>(call, me, devices);
  if (rank_call->EveryoneArrivedWithin(kInlineWait)) {
    // Nothing left to wait for but the peers' arithmetic: finish here.
    if (const std::string error = rank_call->Run(); error.empty()) {
      promise.SetAvailable();
    } else {
      promise.SetError(ffi::Error::Internal(error));
    }
    return future;
  }
  CompleteOnTaskThread(promise, [rank_call] { return rank_call->Run(); });
  return future;
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kRingCpu, RingCpu,
                              JAXRING_RING_BINDING(ffi::Ffi::Bind()));

}  // namespace jaxring
