// Element types, conversions and ring_protocol.h's elementwise operations
// on the host: the CPU handler's arithmetic (float32 accumulation for
// bfloat16 and float16, int32 for int32), also run by the protocol tests.
#pragma once

#include <cstdint>
#include <cstring>

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
  template <typename T>
  void Copy(T* dst, const T* src, int64_t n) {
    std::memcpy(dst, src, n * sizeof(T));
  }
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
