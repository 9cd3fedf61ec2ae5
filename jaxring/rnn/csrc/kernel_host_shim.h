// The CUDA that the persistent layer's kernels use (kernel_platform.cuh lists it), on the host, so
// the tests run the exact device source that nvcc compiles (tests/jaxring/rnn/test_kernels_on_host.py).
//
// A launch runs each block on an OS thread of its own, so blocks really run at the same time and a
// race between blocks (a read of another block's data with no grid.sync between) shows up as wrong
// numbers or under ThreadSanitizer. A block's CUDA threads are fibers on that OS thread, switched
// only at barriers (__syncthreads, __syncwarp, grid.sync, the wmma calls) in a seeded random order:
// a 512-thread block then costs 512 small stacks instead of 512 OS threads, and a thread that
// reads what another thread of its block wrote with no barrier between sees the value or the
// stale one depending on the seed. The barriers are checked as the GPU would need them met: a
// thread that exits while others wait, threads waiting at different kinds of barriers, blocks
// passing different numbers of grid.syncs and a grid barrier not reached in time (kernel_host_grid.cc)
// fail the launch with a message instead of hanging.
//
// Host only: cuda_runtime_api.h gives the types (cudaError_t, cudaStream_t, uint3, dim3); nothing
// calls or links the CUDA runtime.
#pragma once

#include <cuda_runtime_api.h>

#include <math.h>  // expf, tanhf, fminf, fmaxf in the global namespace, as the kernels call them

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>

// Execution-space keywords mean nothing on the host (cuda_runtime_api.h made them attributes
// that the host compiler would warn about); __forceinline__ and __restrict__ are the host's own.
#undef __global__
#undef __device__
#undef __host__
#define __global__
#define __device__
#define __host__

namespace jaxring::rnn::host {

// Where the running CUDA thread is: its indices, its launch's sizes and its block's shared memory.
struct ThreadPlace {
  uint3 thread, block;
  dim3 block_dim, grid_dim;
  unsigned char* shared;
};

// The running CUDA thread's place; a KernelFault outside a launch.
const ThreadPlace& Here();

// A fault the GPU would raise in the running thread (a misaligned tensor-core access, a barrier
// used as the hardware does not allow): ends the launch with `code` and the message.
class KernelFault : public std::runtime_error {
 public:
  KernelFault(cudaError_t code, const std::string& message) : std::runtime_error(message), code(code) {}
  cudaError_t code;
};

// Barriers, as kernel_host_grid.cc checks them.
void SyncBlock();
void SyncGrid();
void SyncWarp();
// A warp-collective call (the wmma ones): all 32 lanes must make it with the same operation,
// pointer and leading dimension, as on the GPU; returns once every lane has arrived.
void WarpCollective(const char* operation, const void* pointer, unsigned leading_dimension);

// How the next launches schedule and how long a grid barrier may wait; set by the tests.
struct LaunchOptions {
  uint64_t seed = 0;             // the fibers' order at each barrier (and each block's own stream)
  double barrier_seconds = 30;   // a block waiting longer at grid.sync fails the launch as a hang
};
LaunchOptions& Options();

// The message of the last launch that failed on this OS thread ("" after a good one).
const std::string& LastLaunchError();

// Runs `thread_body` as every thread of a `blocks` x `threads` grid, each block with
// `shared_bytes` of dynamic shared memory; cudaSuccess, or the first fault (LastLaunchError).
cudaError_t RunGrid(int blocks, int threads, size_t shared_bytes, const std::function<void()>& thread_body);

}  // namespace jaxring::rnn::host

#define threadIdx (::jaxring::rnn::host::Here().thread)
#define blockIdx (::jaxring::rnn::host::Here().block)
#define blockDim (::jaxring::rnn::host::Here().block_dim)
#define gridDim (::jaxring::rnn::host::Here().grid_dim)

inline void __syncthreads() { jaxring::rnn::host::SyncBlock(); }

// Only the full warp: a partial mask is not in kernel_platform.cuh's list.
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  if (mask != 0xffffffffu)
    throw jaxring::rnn::host::KernelFault(cudaErrorNotSupported,
                                          "__syncwarp with a partial mask: the host shim supports the full warp only");
  jaxring::rnn::host::SyncWarp();
}

// The device's fast exponential has a few ulp of error more; the tests' tolerances cover it.
inline float __expf(float x) { return std::exp(x); }

// CUDA's integer and floating min and max, for the types kernels mix least surprisingly.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a < b ? b : a; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a < b ? b : a; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a < b ? b : a; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a < b ? b : a; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }

// bfloat16 as the GPU stores it: float32's upper 16 bits.
struct __nv_bfloat16 {
  uint16_t bits;
};

inline float __bfloat162float(__nv_bfloat16 x) {
  uint32_t wide = uint32_t(x.bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}

// Round to nearest, ties to even, as cvt.rn.bf16.f32; a NaN becomes the canonical NaN.
inline __nv_bfloat16 __float2bfloat16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if (std::isnan(x)) return {uint16_t(0x7fff)};
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return {uint16_t(bits >> 16)};
}

namespace cooperative_groups {
struct grid_group {
  void sync() const { jaxring::rnn::host::SyncGrid(); }
};
struct thread_block {
  void sync() const { jaxring::rnn::host::SyncBlock(); }
};
inline grid_group this_grid() { return {}; }
inline thread_block this_thread_block() { return {}; }
}  // namespace cooperative_groups

namespace jaxring::rnn {

namespace cg = ::cooperative_groups;

inline unsigned char* DynamicShared() { return host::Here().shared; }

// kernel_platform.cuh's cooperative launch: every thread calls the kernel with its own copy of the
// arguments. The stream is the caller's business on the GPU; on the host the launch is synchronous.
template <typename... Params>
cudaError_t LaunchCooperativeGrid(void (*kernel)(Params...), int blocks, int threads, size_t shared_bytes,
                                  cudaStream_t, typename Exactly<Params>::type... args) {
  return host::RunGrid(blocks, threads, shared_bytes, [&] { kernel(args...); });
}

}  // namespace jaxring::rnn

#include "kernel_host_wmma.h"
