// Element types, conversions and ring_protocol.h's elementwise operations
// on the host: the CPU handler's arithmetic (float32 accumulation for
// bfloat16 and float16, int32 for int32), also run by the protocol tests.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace jaxring {

struct Bf16 {
  uint16_t bits;
};

inline float ToAcc(float v) { return v; }
inline int32_t ToAcc(int32_t v) { return v; }
inline float ToAcc(_Float16 v) { return static_cast<float>(v); }
inline float ToAcc(Bf16 v) {
  uint32_t bits = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Stores an accumulated value in the output type.
inline void Store(float v, float* out) { *out = v; }
inline void Store(int32_t v, int32_t* out) { *out = v; }
inline void Store(float v, _Float16* out) { *out = static_cast<_Float16>(v); }
inline void Store(float v, Bf16* out) {  // round to nearest even; NaN stays NaN
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    out->bits = static_cast<uint16_t>((bits >> 16) | 0x40);
    return;
  }
  bits += 0x7fffu + ((bits >> 16) & 1u);
  out->bits = static_cast<uint16_t>(bits >> 16);
}

// ring_protocol.h's elementwise operations on one host thread.
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
  // input at the first reduce-scatter step, its partial sums after.
  template <typename A, typename B, typename D>
  void Add(const A* a, const B* b, D* dst, int64_t n) {
    for (int64_t i = 0; i < n; ++i) Store(ToAcc(a[i]) + ToAcc(b[i]), dst + i);
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
        for (int64_t i = 0; i < count; ++i) sum[i] += ToAcc(in[i]);
      }
      for (int64_t i = 0; i < count; ++i) Store(sum[i], dst + begin + i);
    }
  }
};

}  // namespace jaxring
