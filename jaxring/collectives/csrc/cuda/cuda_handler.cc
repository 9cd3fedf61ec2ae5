// The CUDA handler of the ring collectives: describes the call, checks its
// workspace and runs it on the engine JAXRING_CUDA_ENGINE chooses
// (engine_choice.h).
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "core/ring_handler_common.h"
#include "cuda/cuda_rank.h"
#include "cuda/engine_choice.h"
#include "xla/ffi/api/ffi.h"

namespace jaxring {
namespace {

namespace ffi = xla::ffi;

ffi::Error RingCuda(cudaStream_t stream, ffi::RunId run_id, int32_t device_ordinal,
                    ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> out,
                    ffi::Result<ffi::AnyBuffer> workspace, int64_t op_id, int64_t mode,
                    int64_t elements, ffi::Span<const int64_t> ring_devices,
                    int64_t ring_size, int64_t timeout_ms, int64_t slice_bytes,
                    int64_t reduction) {
  RingCall call;
  if (auto error = DescribeCall(run_id.run_id, device_ordinal, op_id, mode, elements,
                                ring_devices, ring_size, timeout_ms, slice_bytes,
                                x.element_type(), reduction, &call);
      !error.empty()) {
    return ffi::Error::InvalidArgument(error);
  }
  const WorkspaceLayout layout = WorkspaceFor(call, x.element_type(), /*staging_slice=*/true);
  if (auto error = CheckWorkspace(layout, workspace->element_count()); !error.empty()) {
    return ffi::Error::InvalidArgument(error);
  }
  char* ws = static_cast<char*>(workspace->untyped_data());
  CudaRank me{x.untyped_data(), out->untyped_data(),
              layout.partial_sums > 0 ? static_cast<void*>(ws) : out->untyped_data(),
              ws + layout.staging_offset_bytes(), device_ordinal, stream};
  const std::vector<int> devices(ring_devices.begin() + call.key.group * call.ranks,
                                 ring_devices.begin() + (call.key.group + 1) * call.ranks);
  if (auto error = RunCudaCollective(call, me, devices); !error.empty()) {
    return ffi::Error::Internal(error);
  }
  return ffi::Error::Success();
}

}  // namespace

// The handler blocks on the host until its neighbours have enqueued their
// work (both engines), so it is not command-buffer compatible (no traits).
XLA_FFI_DEFINE_HANDLER_SYMBOL(kRingCuda, RingCuda,
                              JAXRING_RING_BINDING(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()));

}  // namespace jaxring
