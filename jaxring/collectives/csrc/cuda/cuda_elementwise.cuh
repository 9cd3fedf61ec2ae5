// Element conversions and 16-byte packs shared by the CUDA engines, and the
// block-wide elementwise operations the device ring's lanes run
// (ring_protocol.h's Elementwise): float32 accumulation for bfloat16 and
// float16, int32 for int32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/device_engine.h"  // kPacksPerPass

namespace jaxring {

__device__ __forceinline__ float ToAcc(float v) { return v; }
__device__ __forceinline__ int32_t ToAcc(int32_t v) { return v; }
__device__ __forceinline__ float ToAcc(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToAcc(__nv_bfloat16 v) { return __bfloat162float(v); }

__device__ __forceinline__ void Store(float v, float* out) { *out = v; }
__device__ __forceinline__ void Store(int32_t v, int32_t* out) { *out = v; }
__device__ __forceinline__ void Store(float v, __half* out) { *out = __float2half_rn(v); }
__device__ __forceinline__ void Store(float v, __nv_bfloat16* out) { *out = __float2bfloat16_rn(v); }

template <typename T>
struct AccumulatorOf {
  using type = float;
};
template <>
struct AccumulatorOf<int32_t> {
  using type = int32_t;
};

// V elements of T loaded or stored at once: 16 bytes of the input type.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

__host__ __device__ inline bool Aligned(const void* p, int bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// dst = a + b over [0, n) by `stride` threads, this one starting at `first`:
// 16 bytes of A per access where every pointer is aligned for it, Packs
// independent packs per thread per pass, all loaded before any is added and
// stored (more bytes in flight per thread).
template <int Packs, typename A, typename B, typename D>
__device__ void AddStrided(const A* a, const B* b, D* dst, int64_t n, int64_t first,
                           int64_t stride) {
  constexpr int V = 16 / sizeof(A);
  int64_t done = 0;
  if (Aligned(a, sizeof(A) * V) && Aligned(b, sizeof(B) * V) && Aligned(dst, sizeof(D) * V)) {
    const int64_t packs = n / V;
    const auto add = [&](const int64_t p, const int count) {
      Pack<A, V> x[Packs];
      Pack<B, V> y[Packs];
#pragma unroll
      for (int u = 0; u < Packs; ++u) {
        if (u < count) {
          x[u] = reinterpret_cast<const Pack<A, V>*>(a)[p + u * stride];
          y[u] = reinterpret_cast<const Pack<B, V>*>(b)[p + u * stride];
        }
      }
#pragma unroll
      for (int u = 0; u < Packs; ++u) {
        if (u < count) {
          Pack<D, V> z;
#pragma unroll
          for (int k = 0; k < V; ++k) Store(ToAcc(x[u].v[k]) + ToAcc(y[u].v[k]), &z.v[k]);
          reinterpret_cast<Pack<D, V>*>(dst)[p + u * stride] = z;
        }
      }
    };
    int64_t p = first;
    for (; p + (Packs - 1) * stride < packs; p += Packs * stride) add(p, Packs);
    for (; p < packs; p += stride) add(p, 1);
    done = packs * V;
  }
  for (int64_t e = done + first; e < n; e += stride) Store(ToAcc(a[e]) + ToAcc(b[e]), dst + e);
}

// The host-staged engine's reduce: the whole grid shares one stage.
template <typename T, typename Left, typename Dst>
__global__ void ReduceKernel(const T* mine, const Left* left, Dst* dst, int64_t n) {
  AddStrided<1>(mine, left, dst, n, blockIdx.x * int64_t{blockDim.x} + threadIdx.x,
             int64_t{gridDim.x} * blockDim.x);
}

// The threads of one block share each operation, 16 bytes per thread and
// access where the pointers allow it, kPacksPerPass (device_engine.h)
// accesses in flight per thread in Copy and Add. Peer buffers are read with plain
// loads, never the read-only path (__ldg, const __restrict__): a peer writes
// them while this kernel runs, and only the flag protocol orders the two.
struct BlockElementwise {
  template <typename T>
  __device__ void Copy(T* dst, const T* src, int64_t n) {
    int64_t done = 0;
    if (Aligned(dst, 16) && Aligned(src, 16)) {
      const int64_t packs = n * static_cast<int64_t>(sizeof(T)) / 16;
      const int64_t stride = blockDim.x;
      int64_t p = threadIdx.x;
      for (; p + (kPacksPerPass - 1) * stride < packs; p += kPacksPerPass * stride) {
        uint4 x[kPacksPerPass];
#pragma unroll
        for (int u = 0; u < kPacksPerPass; ++u) x[u] = reinterpret_cast<const uint4*>(src)[p + u * stride];
#pragma unroll
        for (int u = 0; u < kPacksPerPass; ++u) reinterpret_cast<uint4*>(dst)[p + u * stride] = x[u];
      }
      for (; p < packs; p += stride) {
        reinterpret_cast<uint4*>(dst)[p] = reinterpret_cast<const uint4*>(src)[p];
      }
      done = packs * 16 / static_cast<int64_t>(sizeof(T));
    }
    for (int64_t e = done + threadIdx.x; e < n; e += blockDim.x) dst[e] = src[e];
  }

  // dst = a + b, where b (a peer's) may be of the accumulation type.
  template <typename A, typename B, typename D>
  __device__ void Add(const A* a, const B* b, D* dst, int64_t n) {
    AddStrided<kPacksPerPass>(a, b, dst, n, threadIdx.x, blockDim.x);
  }

  // dst[i] = inputs[0][offset + i] + ... + inputs[ranks - 1][offset + i],
  // added in rank order in the accumulation type.
  template <typename T>
  __device__ void SumInRankOrder(const T* const* inputs, int ranks, int64_t offset, T* dst,
                                 int64_t n) {
    using Acc = typename AccumulatorOf<T>::type;
    constexpr int V = 16 / sizeof(T);
    bool aligned = Aligned(dst, 16);
    for (int r = 0; r < ranks; ++r) aligned = aligned && Aligned(inputs[r] + offset, 16);
    int64_t done = 0;
    if (aligned) {
      const int64_t packs = n / V;
      for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
        Acc sum[V];
        const Pack<T, V> first = reinterpret_cast<const Pack<T, V>*>(inputs[0] + offset)[p];
#pragma unroll
        for (int k = 0; k < V; ++k) sum[k] = ToAcc(first.v[k]);
        for (int r = 1; r < ranks; ++r) {
          const Pack<T, V> x = reinterpret_cast<const Pack<T, V>*>(inputs[r] + offset)[p];
#pragma unroll
          for (int k = 0; k < V; ++k) sum[k] += ToAcc(x.v[k]);
        }
        Pack<T, V> z;
#pragma unroll
        for (int k = 0; k < V; ++k) Store(sum[k], &z.v[k]);
        reinterpret_cast<Pack<T, V>*>(dst)[p] = z;
      }
      done = packs * V;
    }
    for (int64_t e = done + threadIdx.x; e < n; e += blockDim.x) {
      Acc sum = ToAcc(inputs[0][offset + e]);
      for (int r = 1; r < ranks; ++r) sum += ToAcc(inputs[r][offset + e]);
      Store(sum, dst + e);
    }
  }
};

}  // namespace jaxring
