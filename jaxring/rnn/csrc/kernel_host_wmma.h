// The nvcuda::wmma subset that the persistent layer's kernels may use (kernel_platform.cuh), on the
// host: bfloat16 tiles 16x16x16 and tf32 tiles 16x16x8, float32 accumulators. Part of
// kernel_host_shim.h.
//
// Semantics as the CUDA programming guide's "Warp Matrix Functions" give them: a matrix_a tile is
// m x k, a matrix_b tile k x n, an accumulator m x n; ldm is the stride in elements between rows
// (row major) or columns (column major); the pointer must be 256-bit aligned and ldm a multiple of
// 16 bytes' worth of elements (8 bfloat16, 4 float), else the GPU faults, so the shim refuses
// them with cudaErrorMisalignedAddress. Every call ending in _sync is warp-collective: each lane
// must make the same call with the same arguments (host::WarpCollective checks). The GPU spreads a
// tile over the warp's lanes in an unspecified order; here every lane holds the whole tile
// (num_elements = the tile's size, x[] row major), which element-wise code cannot tell apart.
// mma_sync multiplies the tile's values as rounded to the input type and accumulates in float32.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
namespace precision {
struct tf32 {};
}  // namespace precision

// Round to tf32's 10-bit mantissa, to nearest with ties away from zero, as cvt.rna.tf32.f32;
// the result is a float whose low 13 bits are zero. Infinities and NaNs pass unchanged.
inline float __float_to_tf32(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if ((bits & 0x7f800000u) != 0x7f800000u) bits = (bits + 0x1000u) & 0xffffe000u;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

namespace detail {

template <typename T> struct Element { using type = T; };
template <> struct Element<precision::tf32> { using type = float; };

// The tile's rows and columns by its use.
template <typename Use, int M, int N, int K> struct Tile;
template <int M, int N, int K> struct Tile<matrix_a, M, N, K> { static constexpr int rows = M, cols = K; };
template <int M, int N, int K> struct Tile<matrix_b, M, N, K> { static constexpr int rows = K, cols = N; };
template <int M, int N, int K> struct Tile<accumulator, M, N, K> { static constexpr int rows = M, cols = N; };

template <typename Use, int M, int N, int K, typename T, typename Layout>
constexpr bool Supported() {
  constexpr bool shape = M == 16 && N == 16 && (K == 16 || K == 8);
  if constexpr (std::is_same_v<Use, accumulator>) return shape && std::is_same_v<T, float> && std::is_void_v<Layout>;
  constexpr bool type = K == 16 ? std::is_same_v<T, __nv_bfloat16> : std::is_same_v<T, precision::tf32>;
  return shape && type && (std::is_same_v<Layout, row_major> || std::is_same_v<Layout, col_major>);
}

// The value a multiplicand element enters the product with: a tf32 element's low 13 bits are
// not read by the tensor cores (kernels round with __float_to_tf32 first).
inline float Operand(__nv_bfloat16 x) { return __bfloat162float(x); }
inline float Operand(float tf32) {
  uint32_t bits;
  std::memcpy(&bits, &tf32, sizeof bits);
  bits &= 0xffffe000u;
  std::memcpy(&tf32, &bits, sizeof tf32);
  return tf32;
}

template <typename T>
void CheckAlignment(const char* operation, const void* pointer, unsigned ldm) {
  constexpr unsigned kPointerBytes = 32, kStrideBytes = 16;  // 256 bits; 16 bytes of elements
  if (reinterpret_cast<uintptr_t>(pointer) % kPointerBytes != 0)
    throw jaxring::rnn::host::KernelFault(
        cudaErrorMisalignedAddress, std::string(operation) + ": the pointer is not 256-bit (32-byte) aligned, as "
                                        "the GPU requires (offset " +
                                        std::to_string(reinterpret_cast<uintptr_t>(pointer) % kPointerBytes) +
                                        " bytes): align the tile's start");
  if (ldm % (kStrideBytes / sizeof(T)) != 0)
    throw jaxring::rnn::host::KernelFault(
        cudaErrorMisalignedAddress, std::string(operation) + ": ldm " + std::to_string(ldm) + " is not a multiple of " +
                                        std::to_string(kStrideBytes / sizeof(T)) +
                                        " elements (16 bytes), as the GPU requires: pad the rows or columns");
}

}  // namespace detail

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
class fragment {
  static_assert(detail::Supported<Use, M, N, K, T, Layout>(),
                "kernel_host_wmma.h supports bfloat16 16x16x16 and tf32 16x16x8 multiplicands with a row_major or "
                "col_major layout, and float 16x16 accumulators with no layout");

 public:
  using element_type = typename detail::Element<T>::type;
  static constexpr int rows = detail::Tile<Use, M, N, K>::rows, cols = detail::Tile<Use, M, N, K>::cols;
  static constexpr int num_elements = rows * cols;
  element_type x[num_elements];  // the whole tile, row major
};

template <typename Use, int M, int N, int K, typename T, typename Layout>
void fill_fragment(fragment<Use, M, N, K, T, Layout>& f,
                   const typename fragment<Use, M, N, K, T, Layout>::element_type& v) {
  for (auto& e : f.x) e = v;
}

// A multiplicand: its layout is the fragment's.
template <typename Use, int M, int N, int K, typename T, typename Layout,
          typename = std::enable_if_t<!std::is_void_v<Layout>>>
void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f,
                      const typename fragment<Use, M, N, K, T, Layout>::element_type* p, unsigned ldm) {
  using Fragment = fragment<Use, M, N, K, T, Layout>;
  detail::CheckAlignment<typename Fragment::element_type>("wmma::load_matrix_sync", p, ldm);
  jaxring::rnn::host::WarpCollective("wmma::load_matrix_sync", p, ldm);
  constexpr bool by_rows = std::is_same_v<Layout, row_major>;
  for (int r = 0; r < Fragment::rows; ++r)
    for (int c = 0; c < Fragment::cols; ++c)
      f.x[r * Fragment::cols + c] = by_rows ? p[size_t(r) * ldm + c] : p[r + size_t(c) * ldm];
}

// An accumulator: its layout is the call's.
template <int M, int N, int K>
void load_matrix_sync(fragment<accumulator, M, N, K, float>& f, const float* p, unsigned ldm, layout_t layout) {
  detail::CheckAlignment<float>("wmma::load_matrix_sync", p, ldm);
  jaxring::rnn::host::WarpCollective(layout == mem_row_major ? "wmma::load_matrix_sync(mem_row_major)"
                                                            : "wmma::load_matrix_sync(mem_col_major)", p, ldm);
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c)
      f.x[r * N + c] = layout == mem_row_major ? p[size_t(r) * ldm + c] : p[r + size_t(c) * ldm];
}

template <int M, int N, int K>
void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f, unsigned ldm, layout_t layout) {
  detail::CheckAlignment<float>("wmma::store_matrix_sync", p, ldm);
  jaxring::rnn::host::WarpCollective(layout == mem_row_major ? "wmma::store_matrix_sync(mem_row_major)"
                                                            : "wmma::store_matrix_sync(mem_col_major)", p, ldm);
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c)
      (layout == mem_row_major ? p[size_t(r) * ldm + c] : p[r + size_t(c) * ldm]) = f.x[r * N + c];
}

// d = a b + c, each product of the multiplicands' values exact in float32, summed in float32 in k's order.
template <int M, int N, int K, typename T, typename LayoutA, typename LayoutB>
void mma_sync(fragment<accumulator, M, N, K, float>& d, const fragment<matrix_a, M, N, K, T, LayoutA>& a,
              const fragment<matrix_b, M, N, K, T, LayoutB>& b, const fragment<accumulator, M, N, K, float>& c) {
  jaxring::rnn::host::WarpCollective("wmma::mma_sync", nullptr, 0);
  float sums[M * N];
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      float acc = c.x[i * N + j];
      for (int k = 0; k < K; ++k) acc += detail::Operand(a.x[i * K + k]) * detail::Operand(b.x[k * N + j]);
      sums[i * N + j] = acc;
    }
  std::memcpy(d.x, sums, sizeof sums);  // d may be c
}

}  // namespace nvcuda::wmma
