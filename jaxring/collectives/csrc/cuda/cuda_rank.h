// One rank's buffers and stream as both CUDA engines take them.
#pragma once

#include <cuda_runtime.h>

namespace jaxring {

struct CudaRank {
  const void* in;
  void* out;
  void* acc;      // partial results in the accumulation type; `out` when it has that type
  void* staging;  // one slice of the accumulation type, for peers that cannot map each other
  int device;
  cudaStream_t stream;
};

}  // namespace jaxring
