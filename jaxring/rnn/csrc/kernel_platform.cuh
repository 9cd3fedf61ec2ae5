// What the persistent layer's kernels (persistent_rnn_kernels.cuh) use of CUDA: under nvcc the
// real headers; under the host compiler the tests' host stand-ins (kernel_host_shim.h), which
// run a grid's blocks on host threads and each block's threads as fibers.
#pragma once

namespace jaxring::rnn {
// LaunchCooperativeGrid's arguments take the kernel's parameter types exactly (no deduction).
template <typename T> struct Exactly { using type = T; };
}  // namespace jaxring::rnn

#ifdef __CUDACC__
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <mma.h>

namespace jaxring::rnn {

namespace cg = cooperative_groups;

// One cooperative launch of `blocks` x `threads` with `shared_bytes` of dynamic shared memory.
// cudaLaunchCooperativeKernel refuses (cudaErrorCooperativeLaunchTooLarge) a grid that cannot be
// resident at once instead of letting a grid barrier hang. The arguments take the kernel's
// parameter types exactly, as the kernel will read them.
template <typename... Params>
cudaError_t LaunchCooperativeGrid(void (*kernel)(Params...), int blocks, int threads, size_t shared_bytes,
                                  cudaStream_t stream, typename Exactly<Params>::type... args) {
  const void* function = reinterpret_cast<const void*>(kernel);
  cudaError_t error = cudaFuncSetAttribute(function, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared_bytes));
  if (error != cudaSuccess) return error;
  void* pointers[] = {static_cast<void*>(&args)...};
  return cudaLaunchCooperativeKernel(function, dim3(blocks), dim3(threads), pointers, shared_bytes, stream);
}

// The block's dynamic shared memory (the launch's shared-memory bytes), aligned beyond the
// 256 bits wmma's loads and stores need at each tile's start.
__device__ inline unsigned char* DynamicShared() {
  extern __shared__ __align__(128) unsigned char dynamic_shared[];
  return dynamic_shared;
}

}  // namespace jaxring::rnn
#else
#include "kernel_host_shim.h"
#endif
