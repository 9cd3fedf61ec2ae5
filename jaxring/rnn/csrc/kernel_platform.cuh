// What the persistent layer's kernels (persistent_rnn_kernels.cuh) use of CUDA: under nvcc the
// real headers; under the host compiler the tests' host stand-ins, which run a grid's blocks
// and threads on host threads.
#pragma once

#ifdef __CUDACC__
#include <cooperative_groups.h>
#include <cuda_bf16.h>

namespace jaxring::rnn {

namespace cg = cooperative_groups;

// The block's dynamic shared memory (the launch's shared-memory bytes).
__device__ inline unsigned char* DynamicShared() {
  extern __shared__ __align__(16) unsigned char dynamic_shared[];
  return dynamic_shared;
}

}  // namespace jaxring::rnn
#else
#include "kernel_host_shim.h"
#endif
