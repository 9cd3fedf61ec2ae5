// CPU handler of the cross-process leg of jaxring.allreduce(..., processes=...):
// mpi_host_ring.h's legs straight on XLA's buffers. A leg starts on XLA's
// thread and goes on there for as long as the other processes keep it
// waiting no longer than kDefaultLegPatienceUs (mpi_ring.h) at a time (they are in step); else a
// task thread (task_threads.h) takes it over, and XLA's thread returns with a
// future. A hand-off costs as much as a small exchange, and at 4 MiB on 2
// processes the ring ran at 1.2-2.0x the speed with it on XLA's thread
// (docs/PERFORMANCE.md). A leg done on XLA's thread returns no future at all
// (LegOutcome): XLA then treats the call as synchronous, and a future, even
// one already completed, cost as much as the exchange of 8 bytes.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "core/huge_pages.h"
#include "core/task_threads.h"
#include "mpi/mpi_host_ring.h"
#include "mpi/mpi_ring.h"
#include "xla/ffi/api/ffi.h"

namespace jaxring {

// The CPU handler's result: done on XLA's thread (`done`: success or the
// error), or `pending`, a future that a task thread completes.
struct LegOutcome {
  std::optional<xla::ffi::Future> pending;
  xla::ffi::Error done;
};

}  // namespace jaxring

// A handler whose result encodes as an error (none: success) or as a future
// may return either (xla/ffi/api/api.h, Handler::Call).
template <xla::ffi::ExecutionStage stage>
struct xla::ffi::ResultEncoding<stage, jaxring::LegOutcome> {
  static std::variant<XLA_FFI_Error*, XLA_FFI_Future*> Encode(const XLA_FFI_Api* api, XLA_FFI_ExecutionContext* ctx,
                                                                jaxring::LegOutcome outcome) {
    if (outcome.pending) return ResultEncoding<stage, Future>::Encode(api, ctx, std::move(*outcome.pending));
    return ResultEncoding<stage, Error>::Encode(api, ctx, std::move(outcome.done));
  }
};

namespace jaxring {
namespace {

namespace ffi = xla::ffi;

std::atomic<int64_t> patience_us{kDefaultLegPatienceUs};
std::atomic<int64_t> finished_on_xla_thread{0}, handed_off{0};

// The plan's id comes as an operand (a constant of the program), not as an
// attribute: XLA's CPU runtime reads an operand's pointer at no cost but
// decodes attributes at every call (leg_plan.h).
LegOutcome MpiRingCpu(int32_t device_ordinal, ffi::AnyBuffer x, ffi::Buffer<ffi::DataType::S32> plan,
                      ffi::Result<ffi::AnyBuffer> out) {
  Leg leg{};
  if (ffi::Error error = OpenLeg(*plan.typed_data(), device_ordinal, x.element_type(), &leg); error.failure()) {
    return {std::nullopt, std::move(error)};
  }
  AdviseHugePages(out->untyped_data(), out->size_bytes());
  std::unique_ptr<LegInFlight> started =
      StartLeg(x.untyped_data(), out->untyped_data(), static_cast<int64_t>(x.element_count()), leg);
  std::string error;
  const auto patience = std::chrono::microseconds(patience_us.load(std::memory_order_relaxed));
  if (started->Finish(patience, &error)) {
    finished_on_xla_thread.fetch_add(1, std::memory_order_relaxed);
    return {std::nullopt, error.empty() ? ffi::Error::Success() : ffi::Error::Internal(error)};
  }
  handed_off.fetch_add(1, std::memory_order_relaxed);
  ffi::Promise promise;
  ffi::Future future(promise);
  // Shared only now: the task's std::function must be copyable.
  CompleteOnTaskThread(promise, [leg = std::shared_ptr<LegInFlight>(std::move(started))] {
    std::string error;
    leg->Finish(Clock::duration::max(), &error);
    return error;
  });
  return {std::move(future), ffi::Error::Success()};
}

}  // namespace

void SetLegPatienceUs(int64_t us) { patience_us.store(us, std::memory_order_relaxed); }

LegThreads CpuLegThreads() {
  return {finished_on_xla_thread.load(std::memory_order_relaxed),
          handed_off.load(std::memory_order_relaxed)};
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(kMpiRingCpu, MpiRingCpu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::DataType::S32>>()
                                  .Ret<ffi::AnyBuffer>());

}  // namespace jaxring
