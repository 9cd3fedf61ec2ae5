// CPU handler of the cross-process leg of jaxring.allreduce(..., processes=True):
// mpi_host_ring.h's ring straight on XLA's buffers, on a thread of its own
// (task_threads.h): XLA's worker thread returns at once with a future.
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "mpi_host_ring.h"
#include "mpi_ring.h"
#include "task_threads.h"
#include "xla/ffi/api/ffi.h"

namespace jaxring {
namespace {

namespace ffi = xla::ffi;

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
  CompleteOnTaskThread(promise, [type = x.element_type(), in = x.untyped_data(), result = out->untyped_data(),
                                 elements = static_cast<int64_t>(x.element_count()), leg] {
    return RunHostRing(type, in, result, elements, leg);
  });
  return future;
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kMpiRingCpu, MpiRingCpu, JAXRING_MPI_LEG_BINDING(ffi::Ffi::Bind()));

}  // namespace jaxring
