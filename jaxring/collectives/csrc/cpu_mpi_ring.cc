// CPU handler of the cross-process leg of jaxring.allreduce(..., processes=True):
// mpi_host_ring.h's legs straight on XLA's buffers. The ring runs on a thread
// of its own (task_threads.h): XLA's worker thread returns at once with a
// future. A one-shot leg starts on XLA's thread and finishes there if it can
// within a few tens of microseconds (a thread hand-off costs as much as the
// exchange), else on a task thread too.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "huge_pages.h"
#include "mpi_host_ring.h"
#include "mpi_ring.h"
#include "task_threads.h"
#include "xla/ffi/api/ffi.h"

namespace jaxring {
namespace {

namespace ffi = xla::ffi;

// How long a one-shot leg may wait on XLA's thread before a task thread takes it.
constexpr auto kInlineWait = std::chrono::microseconds(50);

ffi::Future MpiRingCpu(int32_t device_ordinal, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> out,
                       int64_t tag, int64_t timeout_ms, std::string_view what, int64_t one_shot,
                       int64_t piece_elements) {
  ffi::Promise promise;
  ffi::Future future(promise);
  Leg leg{};
  if (ffi::Error error = OpenLeg(device_ordinal, x.element_type(), tag, timeout_ms, what, one_shot,
                                     piece_elements, &leg);
      error.failure()) {
    promise.SetError(std::move(error));
    return future;
  }
  AdviseHugePages(out->untyped_data(), out->size_bytes());
  if (leg.one_shot && leg.size > 1) {
    // Posted here, on XLA's thread, and finished here when the other
    // processes' buffers arrive within kInlineWait (they are in step); else
    // on a task thread, so XLA's thread never waits on a peer for long.
    auto shot = std::make_shared<OneShot>(x.element_type(), x.untyped_data(), out->untyped_data(),
                                          static_cast<int64_t>(x.element_count()), leg);
    std::string error;
    if (shot->Finish(std::min(Clock::now() + kInlineWait, leg.deadline), &error)) {
      if (error.empty()) {
        promise.SetAvailable();
      } else {
        promise.SetError(ffi::Error::Internal(error));
      }
      return future;
    }
    CompleteOnTaskThread(promise, [shot, deadline = leg.deadline] {
      std::string error;
      shot->Finish(deadline, &error);
      return error;
    });
    return future;
  }
  CompleteOnTaskThread(promise, [type = x.element_type(), in = x.untyped_data(), result = out->untyped_data(),
                                 elements = static_cast<int64_t>(x.element_count()), leg] {
    return RunHostRing(type, in, result, elements, leg);
  });
  return future;
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kMpiRingCpu, MpiRingCpu, JAXRING_MPI_LEG_BINDING(ffi::Ffi::Bind()));

}  // namespace jaxring
