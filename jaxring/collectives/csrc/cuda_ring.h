// The CUDA ring engine, kept apart from its XLA binding (module_cuda.cc) so
// that the engine can be driven without XLA, several ranks on one GPU.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "ring_handler_common.h"
#include "xla/ffi/api/ffi.h"

namespace jaxring {

struct CudaRank {
  const void* in;
  void* out;
  void* acc;      // partial sums (float32 / int32); `out` when it has that type
  void* staging;  // one slice of the accumulation type, for peers that cannot map each other
  int device;
  cudaStream_t stream;
};

// Whether `device` can read `peer`'s memory; enables peer access on the
// first ask for each ordered pair (`device` must be current).
bool PeerReadable(int device, int peer);

// Runs one rank of the ring on `me.stream`; returns "" or the error. Blocks
// the calling host thread until every rank has enqueued its work (never until
// the GPU work finishes).
std::string RunCudaRing(const RingCall& call, xla::ffi::DataType type,
                        const CudaRank& me);

}  // namespace jaxring
