// Element types, conversions and ring_protocol.h's elementwise operations
// on the host: the CPU handler's arithmetic (float32 accumulation for
// bfloat16 and float16, every other type in itself: ring_handler_common.h's
// kElementTypes), also run by the protocol tests.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "core/reduction.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace jaxring {

struct Bf16 {
  uint16_t bits;
};

inline float FloatOfBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline uint32_t BitsOfFloat(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

// Every type accumulates in itself but the 16-bit floats.
template <typename T>
inline T ToAcc(T v) {
  return v;
}
// float16 by its bits: a cast compiles to a library call per element on an
// x86 build not made for F16C (0.4-0.8x lax.psum, docs/PERFORMANCE.md); this
// vectorises. The
// exponent is rebiased (15 -> 127); infinities and NaNs take the top
// exponent; a subnormal m * 2^-24 is read as the normal 2^-14 + m * 2^-24
// and 2^-14 taken off, exactly, with no subnormal float arithmetic (which
// XLA's threads may flush to zero).
inline float ToAcc(_Float16 v) {
  uint16_t h;
  std::memcpy(&h, &v, sizeof h);
  const uint32_t magnitude = h & 0x7fffu;
  uint32_t bits = (magnitude << 13) + (112u << 23);
  bits += magnitude >= 0x7c00u ? 112u << 23 : 0u;
  const float subnormal = FloatOfBits(bits + (1u << 23)) - FloatOfBits(113u << 23);
  const uint32_t unsigned_bits = magnitude < 0x0400u ? BitsOfFloat(subnormal) : bits;
  return FloatOfBits(unsigned_bits | (static_cast<uint32_t>(h & 0x8000u) << 16));
}
inline float ToAcc(Bf16 v) { return FloatOfBits(static_cast<uint32_t>(v.bits) << 16); }

// Stores an accumulated value in the output type.
template <typename T>
inline void Store(T v, T* out) {
  *out = v;
}
// Round to nearest even, by the bits as ToAcc(_Float16) reads them: from
// 65520 (halfway past the largest, 65504) infinity; a NaN stays NaN, quiet,
// with its payload's top bits (as F16C's conversion does);
// below 2^-14 the float addition of 0.5 rounds to a multiple of 2^-24 (its
// unit in the last place there), whose count is the subnormal's bits.
inline void Store(float v, _Float16* out) {
  const uint32_t bits = BitsOfFloat(v);
  const uint32_t magnitude = bits & 0x7fffffffu;
  const uint32_t normal = (magnitude + 0xfffu + ((magnitude >> 13) & 1u) - (112u << 23)) >> 13;
  const uint32_t subnormal = BitsOfFloat(FloatOfBits(magnitude) + 0.5f) - BitsOfFloat(0.5f);
  uint32_t h = magnitude < (113u << 23) ? subnormal : normal;
  h = magnitude >= 0x477ff000u ? 0x7c00u : h;
  h = magnitude > 0x7f800000u ? 0x7e00u | ((magnitude >> 13) & 0x3ffu) : h;
  const uint16_t half = static_cast<uint16_t>(h | ((bits >> 16) & 0x8000u));
  std::memcpy(out, &half, sizeof half);
}
// Round to nearest even; a NaN stays NaN, quiet. Without a branch, so that
// the compiler vectorises it.
inline void Store(float v, Bf16* out) {
  const uint32_t bits = BitsOfFloat(v);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x40u;
  out->bits = static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

// One step of a reduction (core/reduction.h) in the accumulation type:
// `earlier` holds the ranks before `later` in the order the reduction takes
// them (a partial result, or the first rank's value).
template <Reduction R>
struct Combine;

template <>
struct Combine<Reduction::kSum> {
  template <typename A>
  static A Of(A earlier, A later) {
    if constexpr (std::is_integral_v<A>) {
      // Unsigned arithmetic wraps by definition (a signed overflow is undefined).
      using U = std::make_unsigned_t<A>;
      return static_cast<A>(static_cast<U>(static_cast<U>(earlier) + static_cast<U>(later)));
    } else {
      return earlier + later;
    }
  }
};

// lax's start from -inf (+inf for min): a NaN `earlier` (the first rank's) is
// that start, and a later value replaces the running one only where strictly
// greater (smaller), so a NaN never does and the lowest rank wins ties.
template <typename A>
A RunningFrom(A earlier, A start) {
  if constexpr (std::numeric_limits<A>::has_quiet_NaN) {
    return earlier != earlier ? start : earlier;
  } else {
    return earlier;
  }
}

template <>
struct Combine<Reduction::kMax> {
  template <typename A>
  static A Of(A earlier, A later) {
    const A running = RunningFrom<A>(earlier, -std::numeric_limits<A>::infinity());
    return running < later ? later : running;
  }
};

template <>
struct Combine<Reduction::kMin> {
  template <typename A>
  static A Of(A earlier, A later) {
    const A running = RunningFrom<A>(earlier, std::numeric_limits<A>::infinity());
    return later < running ? later : running;
  }
};

// ring_protocol.h's elementwise operations on one host thread; `Add` and
// `SumInRankOrder` reduce by R.
template <Reduction R = Reduction::kSum>
struct HostElementwise {
  // Large copies bypass the cache (the destination is another rank's
  // output, read next by that rank's program, not by this thread), which
  // saves reading every destination line before writing it.
  template <typename T>
  void Copy(T* dst, const T* src, int64_t n) {
    CopyBytes(reinterpret_cast<char*>(dst), reinterpret_cast<const char*>(src), n * sizeof(T));
  }
  static void CopyBytes(char* dst, const char* src, int64_t bytes) {
#if defined(__SSE2__)
    if (bytes >= kStreamingCopyBytes) {
      const int64_t head = (16 - reinterpret_cast<uintptr_t>(dst) % 16) % 16;
      std::memcpy(dst, src, head);
      const int64_t packs = (bytes - head) / 16;
      for (int64_t i = 0; i < packs; ++i) {
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + head) + i);
        _mm_stream_si128(reinterpret_cast<__m128i*>(dst + head) + i, v);
      }
      // Streaming stores are not ordered by the release store that publishes them.
      _mm_sfence();
      const int64_t done = head + packs * 16;
      std::memcpy(dst + done, src + done, bytes - done);
      return;
    }
#endif
    std::memcpy(dst, src, bytes);
  }
  static constexpr int64_t kStreamingCopyBytes = 256 << 10;
  // `B` is the type of what the left neighbour holds for this stage: its
  // input at the first reduce-scatter step, its partial sums after; it comes
  // before this rank's `a` in the reduction's order.
  template <typename A, typename B, typename D>
  void Add(const A* a, const B* b, D* dst, int64_t n) {
    for (int64_t i = 0; i < n; ++i) Store(Combine<R>::Of(ToAcc(b[i]), ToAcc(a[i])), dst + i);
  }
  // Block by block, so that the compiler vectorises the adds over elements
  // while each element is still summed in rank order.
  template <typename T>
  void SumInRankOrder(const T* const* inputs, int ranks, int64_t offset, T* dst, int64_t n) {
    using Acc = decltype(ToAcc(T{}));
    constexpr int64_t kBlock = 512;
    Acc sum[kBlock];
    for (int64_t begin = 0; begin < n; begin += kBlock) {
      const int64_t count = n - begin < kBlock ? n - begin : kBlock;
      const T* first = inputs[0] + offset + begin;
      for (int64_t i = 0; i < count; ++i) sum[i] = ToAcc(first[i]);
      for (int p = 1; p < ranks; ++p) {
        const T* in = inputs[p] + offset + begin;
        for (int64_t i = 0; i < count; ++i) sum[i] = Combine<R>::Of(sum[i], ToAcc(in[i]));
      }
      for (int64_t i = 0; i < count; ++i) Store(sum[i], dst + begin + i);
    }
  }
};

}  // namespace jaxring
