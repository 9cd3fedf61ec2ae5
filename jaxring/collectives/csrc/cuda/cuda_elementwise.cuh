// Element conversions, reductions and 16-byte packs shared by the CUDA
// engines, and the block-wide elementwise operations the device ring's lanes
// run (ring_protocol.h's Elementwise): float32 accumulation for bfloat16 and
// float16, every other type in itself.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "core/ring_handler_common.h"  // Reduction
#include "cuda/device_engine.h"  // kPacksPerPass

namespace jaxring {

// Host and device: the harness runs the element rules on the host too
// (HarnessCombineOnHost, tests/jaxring/collectives/test_cuda_harness.py).
#define JAXRING_ELEMENT __host__ __device__ __forceinline__

template <typename T>
JAXRING_ELEMENT T ToAcc(T v) {
  return v;
}
JAXRING_ELEMENT float ToAcc(__half v) { return __half2float(v); }
JAXRING_ELEMENT float ToAcc(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
JAXRING_ELEMENT void Store(T v, T* out) {
  *out = v;
}
JAXRING_ELEMENT void Store(float v, __half* out) { *out = __float2half_rn(v); }
JAXRING_ELEMENT void Store(float v, __nv_bfloat16* out) { *out = __float2bfloat16_rn(v); }

template <typename T>
struct AccumulatorOf {
  using type = T;
};
template <>
struct AccumulatorOf<__half> {
  using type = float;
};
template <>
struct AccumulatorOf<__nv_bfloat16> {
  using type = float;
};

template <typename T>
struct TypeTag {
  using type = T;
};

// The types the CUDA engines take, each with the C++ type they hold its
// elements in: the one list every per-type kernel is instantiated from.
template <xla::ffi::DataType D, typename T>
struct EngineType {
  static constexpr xla::ffi::DataType kType = D;
  using type = T;
};
template <typename... Entries>
struct EngineTypeList {
  // Calls visit(TypeTag<T>{}) for `type`'s T; false (and no call) for a type
  // not in the list.
  template <typename Visitor>
  static bool Visit(xla::ffi::DataType type, Visitor&& visit) {
    return ((type == Entries::kType && (visit(TypeTag<typename Entries::type>{}), true)) || ...);
  }
  template <typename Visitor>
  static void VisitEvery(Visitor&& visit) {
    (visit(TypeTag<typename Entries::type>{}), ...);
  }
};
using EngineTypes = EngineTypeList<
    EngineType<xla::ffi::DataType::F32, float>, EngineType<xla::ffi::DataType::F64, double>,
    EngineType<xla::ffi::DataType::BF16, __nv_bfloat16>, EngineType<xla::ffi::DataType::F16, __half>,
    EngineType<xla::ffi::DataType::S8, int8_t>, EngineType<xla::ffi::DataType::S16, int16_t>,
    EngineType<xla::ffi::DataType::S32, int32_t>, EngineType<xla::ffi::DataType::S64, int64_t>,
    EngineType<xla::ffi::DataType::U8, uint8_t>, EngineType<xla::ffi::DataType::U16, uint16_t>,
    EngineType<xla::ffi::DataType::U32, uint32_t>, EngineType<xla::ffi::DataType::U64, uint64_t>>;

// a (op) b in the accumulation type V, as XLA's GPU code computes lax's
// psum, pmax and pmin: integer sums wrap (added as unsigned, which C++
// defines); float max and min propagate NaN and order -0 below +0 (XLA's
// EmitFloatMax/Min: llvm.maximum/minimum). Selects, not fmaxf/fminf, which
// drop a NaN.
template <Reduction R, typename V>
JAXRING_ELEMENT V Combine(V a, V b) {
  if constexpr (R == Reduction::kSum) {
    if constexpr (std::is_integral_v<V>) {
      using U = std::make_unsigned_t<V>;
      return static_cast<V>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else {
      return a + b;
    }
  } else if constexpr (std::is_integral_v<V>) {
    return R == Reduction::kMax ? (a > b ? a : b) : (a < b ? a : b);
  } else if constexpr (R == Reduction::kMax) {
    return a > b || (a == b && !signbit(a)) || a != a ? a : b;
  } else {
    return a < b || (a == b && signbit(a)) || a != a ? a : b;
  }
}

// V elements of T loaded or stored at once: 16 bytes of the input type.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

__host__ __device__ inline bool Aligned(const void* p, int bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// dst = a (op R) b over [0, n) by `stride` threads, this one starting at `first`:
// 16 bytes of A per access where every pointer is aligned for it, Packs
// independent packs per thread per pass, all loaded before any is combined
// and stored (more bytes in flight per thread).
template <int Packs, Reduction R, typename A, typename B, typename D>
__device__ void CombineStrided(const A* a, const B* b, D* dst, int64_t n, int64_t first,
                               int64_t stride) {
  constexpr int V = 16 / sizeof(A);
  int64_t done = 0;
  if (Aligned(a, sizeof(A) * V) && Aligned(b, sizeof(B) * V) && Aligned(dst, sizeof(D) * V)) {
    const int64_t packs = n / V;
    const auto combine = [&](const int64_t p, const int count) {
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
          for (int k = 0; k < V; ++k) Store(Combine<R>(ToAcc(x[u].v[k]), ToAcc(y[u].v[k])), &z.v[k]);
          reinterpret_cast<Pack<D, V>*>(dst)[p + u * stride] = z;
        }
      }
    };
    int64_t p = first;
    for (; p + (Packs - 1) * stride < packs; p += Packs * stride) combine(p, Packs);
    for (; p < packs; p += stride) combine(p, 1);
    done = packs * V;
  }
  for (int64_t e = done + first; e < n; e += stride) {
    Store(Combine<R>(ToAcc(a[e]), ToAcc(b[e])), dst + e);
  }
}

// The host-staged engine's reduce: the whole grid shares one stage.
template <Reduction R, typename T, typename Left, typename Dst>
__global__ void ReduceKernel(const T* mine, const Left* left, Dst* dst, int64_t n) {
  CombineStrided<1, R>(mine, left, dst, n, blockIdx.x * int64_t{blockDim.x} + threadIdx.x,
                       int64_t{gridDim.x} * blockDim.x);
}

// The reductions one device-ring kernel runs: the sum alone, or max and min
// chosen per operation, so that the sum's loops are compiled as before max
// and min existed (same registers, same code) and a type needs two kernels,
// not three (nvcc time, docs/CUDA_RING.md).
enum class KernelReductions { kSum, kMaxMin };

// The threads of one block share each operation, 16 bytes per thread and
// access where the pointers allow it, kPacksPerPass (device_engine.h)
// accesses in flight per thread in Copy and Add (half as many for max and
// min, whose selects need more registers: at kPacksPerPass bfloat16 and
// float16 spill under the kernel's bound). Peer buffers are read with plain
// loads, never the read-only path (__ldg, const __restrict__): a peer writes
// them while this kernel runs, and only the flag protocol orders the two.
template <KernelReductions K>
struct BlockElementwise {
  Reduction reduction;  // the call's: kSum, or kMax or kMin where K is kMaxMin

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

  // dst = a (op) b, where b (a peer's) may be of the accumulation type.
  template <typename A, typename B, typename D>
  __device__ void Add(const A* a, const B* b, D* dst, int64_t n) {
    constexpr int kSelectPacks = kPacksPerPass / 2;
    if constexpr (K == KernelReductions::kSum) {
      CombineStrided<kPacksPerPass, Reduction::kSum>(a, b, dst, n, threadIdx.x, blockDim.x);
    } else if (reduction == Reduction::kMax) {
      CombineStrided<kSelectPacks, Reduction::kMax>(a, b, dst, n, threadIdx.x, blockDim.x);
    } else {
      CombineStrided<kSelectPacks, Reduction::kMin>(a, b, dst, n, threadIdx.x, blockDim.x);
    }
  }

  // dst[i] = inputs[0][offset + i] (op) ... (op) inputs[ranks - 1][offset + i],
  // combined in rank order in the accumulation type.
  template <typename T>
  __device__ void SumInRankOrder(const T* const* inputs, int ranks, int64_t offset, T* dst,
                                 int64_t n) {
    if constexpr (K == KernelReductions::kSum) {
      CombineInRankOrder<Reduction::kSum>(inputs, ranks, offset, dst, n);
    } else if (reduction == Reduction::kMax) {
      CombineInRankOrder<Reduction::kMax>(inputs, ranks, offset, dst, n);
    } else {
      CombineInRankOrder<Reduction::kMin>(inputs, ranks, offset, dst, n);
    }
  }

  template <Reduction R, typename T>
  __device__ void CombineInRankOrder(const T* const* inputs, int ranks, int64_t offset, T* dst,
                                     int64_t n) {
    using Acc = typename AccumulatorOf<T>::type;
    constexpr int V = 16 / sizeof(T);
    bool aligned = Aligned(dst, 16);
    for (int r = 0; r < ranks; ++r) aligned = aligned && Aligned(inputs[r] + offset, 16);
    int64_t done = 0;
    if (aligned) {
      const int64_t packs = n / V;
      for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
        Acc acc[V];
        const Pack<T, V> first = reinterpret_cast<const Pack<T, V>*>(inputs[0] + offset)[p];
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] = ToAcc(first.v[k]);
        for (int r = 1; r < ranks; ++r) {
          const Pack<T, V> x = reinterpret_cast<const Pack<T, V>*>(inputs[r] + offset)[p];
#pragma unroll
          for (int k = 0; k < V; ++k) acc[k] = Combine<R>(acc[k], ToAcc(x.v[k]));
        }
        Pack<T, V> z;
#pragma unroll
        for (int k = 0; k < V; ++k) Store(acc[k], &z.v[k]);
        reinterpret_cast<Pack<T, V>*>(dst)[p] = z;
      }
      done = packs * V;
    }
    for (int64_t e = done + threadIdx.x; e < n; e += blockDim.x) {
      Acc acc = ToAcc(inputs[0][offset + e]);
      for (int r = 1; r < ranks; ++r) acc = Combine<R>(acc, ToAcc(inputs[r][offset + e]));
      Store(acc, dst + e);
    }
  }
};

}  // namespace jaxring
