// CUDA handler of the cross-process leg of jaxring.allreduce(..., processes=...):
// the chunk is copied on XLA's stream into pinned host memory, the stream is
// synchronised, mpi_host_ring.h's ring (the CPU handler's) sums it over the
// processes, and the result is copied back on the stream. MPI never sees
// device memory, so any MPI build works (as mpi4jax's host staging did).
//
// The handler blocks XLA's thread of this device for the leg: the device has
// nothing to run before the sum arrives. The deadline counts from when the
// chunk is on the host, not from the call: XLA calls the handler when it
// enqueues the leg, which may be long before the stream reaches it.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "mpi/mpi_host_ring.h"
#include "mpi/mpi_ring.h"
#include "xla/ffi/api/ffi.h"

namespace jaxring {
namespace {

namespace ffi = xla::ffi;

// One device's pinned staging memory: the input half then the output half
// (the ring reads its input while it writes its output). Allocated with
// cudaHostAlloc on first use, grown when a larger chunk comes, never per call.
struct Staging {
  std::mutex mu;  // held for a whole leg: one leg of a device uses the memory at a time
  char* host = nullptr;
  size_t bytes = 0;
  // Recorded after the last copy back to the device: the memory is free to
  // reuse (or to free) once it has completed.
  cudaEvent_t copied_back = nullptr;
};

Staging& StagingFor(int32_t device_ordinal) {
  static std::mutex mu;
  static auto* by_device = new std::unordered_map<int32_t, std::unique_ptr<Staging>>();  // never freed: outlives main
  std::lock_guard<std::mutex> lock(mu);
  auto& staging = (*by_device)[device_ordinal];
  if (!staging) staging = std::make_unique<Staging>();
  return *staging;
}

ffi::Error CudaError(const char* what, cudaError_t err) {
  return ffi::Error::Internal(std::string("jaxring CUDA leg across processes: ") + what + ": " +
                              cudaGetErrorString(err));
}

// Makes `staging` hold at least `bytes`, once the last leg's copy back is done.
ffi::Error Reserve(Staging& staging, size_t bytes) {
  cudaError_t err = cudaSuccess;
  if (staging.copied_back == nullptr) {
    err = cudaEventCreateWithFlags(&staging.copied_back, cudaEventDisableTiming);
    if (err != cudaSuccess) return CudaError("cudaEventCreate", err);
  }
  err = cudaEventSynchronize(staging.copied_back);
  if (err != cudaSuccess) return CudaError("waiting for the last copy back", err);
  if (staging.bytes >= bytes) return ffi::Error::Success();
  if (staging.host != nullptr) {
    err = cudaFreeHost(staging.host);
    staging.host = nullptr;
    staging.bytes = 0;
    if (err != cudaSuccess) return CudaError("cudaFreeHost", err);
  }
  void* host = nullptr;
  err = cudaHostAlloc(&host, bytes, cudaHostAllocPortable);
  if (err != cudaSuccess) return CudaError("cudaHostAlloc of the staging memory", err);
  staging.host = static_cast<char*>(host);
  staging.bytes = bytes;
  return ffi::Error::Success();
}

// The plan's id as an attribute: an operand would be in device memory.
ffi::Error MpiRingCuda(cudaStream_t stream, int32_t device_ordinal, ffi::AnyBuffer x,
                       ffi::Result<ffi::AnyBuffer> out, int64_t plan) {
  Leg leg{};
  if (ffi::Error error = OpenLeg(plan, device_ordinal, x.element_type(), &leg); error.failure()) {
    return error;
  }
  cudaError_t err = cudaSetDevice(device_ordinal);
  if (err != cudaSuccess) return CudaError("cudaSetDevice", err);
  const size_t bytes = x.size_bytes();
  Staging& staging = StagingFor(device_ordinal);
  std::lock_guard<std::mutex> lock(staging.mu);
  if (ffi::Error error = Reserve(staging, 2 * bytes); error.failure()) return error;
  char* in = staging.host;
  char* result = staging.host + bytes;
  err = cudaMemcpyAsync(in, x.untyped_data(), bytes, cudaMemcpyDeviceToHost, stream);
  if (err != cudaSuccess) return CudaError("cudaMemcpyAsync of the chunk to the host", err);
  err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess) return CudaError("cudaStreamSynchronize before the leg", err);
  leg.deadline = DeadlineFor(leg.plan->timeout_ms);
  const std::string error = RunHostRing(in, result, static_cast<int64_t>(x.element_count()), leg);
  if (!error.empty()) return ffi::Error::Internal(error);
  err = cudaMemcpyAsync(out->untyped_data(), result, bytes, cudaMemcpyHostToDevice, stream);
  if (err != cudaSuccess) return CudaError("cudaMemcpyAsync of the sum to the device", err);
  err = cudaEventRecord(staging.copied_back, stream);
  if (err != cudaSuccess) return CudaError("cudaEventRecord", err);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kMpiRingCuda, MpiRingCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("plan"));

}  // namespace jaxring
