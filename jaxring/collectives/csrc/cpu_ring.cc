// CPU handler of the ring collectives: a real ring across the host-device
// threads that XLA runs one per device. Each rank reads only its left
// neighbour's buffers, as a GPU rank reads its neighbour over peer access.
#include <cstring>
#include <string>

#include "xla/ffi/api/ffi.h"

#include "rendezvous.h"
#include "host_elementwise.h"
#include "ring_handler_common.h"
#include "ring_protocol.h"
#include "ring_schedule.h"
#include "task_threads.h"

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

// Asynchronous: returns at once and completes the future when the rank is
// done, on a task thread (ranks wait for their peers, possibly until the
// timeout, so they must not hold XLA's threads: task_threads.h).
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
  CompleteOnTaskThread(promise, [type = x.element_type(), call, me]() mutable { return RunRingOf(type, call, me); });
  return future;
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kRingCpu, RingCpu,
                              JAXRING_RING_BINDING(ffi::Ffi::Bind()));

}  // namespace jaxring
