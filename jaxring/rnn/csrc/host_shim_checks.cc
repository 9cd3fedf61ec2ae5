// Small kernels that prove kernel_host_shim.h catches what would go wrong on the GPU (each broken
// one next to its correct twin) and that its wmma and rounding match the GPU's definitions, for
// tests/jaxring/rnn/test_kernels_on_host.py (part of module _jaxring_rnn_host_test).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "kernel_platform.cuh"

namespace nb = nanobind;

namespace jaxring::rnn {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kTile = 16;
constexpr int kThreads = 64;  // two warps

// Each thread publishes its index + 1 in shared memory and reads its neighbour's.
__global__ void Rotate(float* out, bool barrier) {
  float* slots = reinterpret_cast<float*>(DynamicShared());
  slots[threadIdx.x] = float(threadIdx.x + 1);
  if (barrier) __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = slots[(threadIdx.x + 1) % blockDim.x];
}

// One thread returns before a barrier that the others wait at.
__global__ void ExitBeforeBarrier(float* out, bool broken) {
  if (broken && threadIdx.x == 5) return;
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = 1;
}

// Block 1 skips the grid barrier that the others wait at.
__global__ void SkipGridSync(float* out, bool broken) {
  if (!(broken && blockIdx.x == 1)) cg::this_grid().sync();
  out[blockIdx.x * blockDim.x + threadIdx.x] = 1;
}

// Half the block waits at the block barrier, half at the grid's.
__global__ void MixedBarriers(float* out, bool broken) {
  if (broken && threadIdx.x < blockDim.x / 2) cg::this_grid().sync();
  else cg::this_thread_block().sync();
  out[blockIdx.x * blockDim.x + threadIdx.x] = 1;
}

// How the lanes of a warp make LoadTile's wmma call: all alike, only the first half (the other
// half returns first), or each lane with its own row of the tile as the pointer.
enum Lanes { kAllLanes, kHalfReturns, kOwnPointer };

// A bfloat16 tile loaded from `offset` elements into shared memory with row stride `ldm` by the
// warps' lanes as `lanes` says, stored back as float.
__global__ void LoadTile(float* out, int offset, int ldm, int lanes) {
  __nv_bfloat16* tile = reinterpret_cast<__nv_bfloat16*>(DynamicShared());
  for (int i = threadIdx.x; i < kTile * 32; i += blockDim.x) tile[i] = __float2bfloat16(float(i % 7));
  __syncthreads();
  const int lane = threadIdx.x % 32;
  if (lanes == kHalfReturns && lane >= 16) return;
  wmma::fragment<wmma::matrix_a, kTile, kTile, kTile, __nv_bfloat16, wmma::row_major> a;
  wmma::load_matrix_sync(a, tile + offset + (lanes == kOwnPointer ? lane % 2 * ldm : 0), ldm);
  if (threadIdx.x == 0)
    for (int i = 0; i < a.num_elements; ++i) out[i] = __bfloat162float(a.x[i]);
}

// Block 1 takes longer than the test's barrier deadline to reach the grid barrier (host-only code:
// this file is never compiled by nvcc).
__global__ void SlowBlock(float* out, bool broken) {
  constexpr auto kSlow = std::chrono::milliseconds(300);
  if (broken && blockIdx.x == 1 && threadIdx.x == 0) std::this_thread::sleep_for(kSlow);
  cg::this_grid().sync();
  out[blockIdx.x * blockDim.x + threadIdx.x] = 1;
}

const std::map<std::string, std::tuple<void (*)(float*, bool), int>> kBarrierChecks = {
    {"rotate", {Rotate, 1}},
    {"exit_before_barrier", {ExitBeforeBarrier, 1}},
    {"skip_grid_sync", {SkipGridSync, 3}},
    {"mixed_barriers", {MixedBarriers, 2}},
    {"slow_block", {SlowBlock, 3}},
};

using Floats = nb::ndarray<float, nb::c_contig, nb::device::cpu>;
using Bits = nb::ndarray<uint16_t, nb::c_contig, nb::device::cpu>;

std::unique_ptr<float, decltype(&std::free)> Aligned(size_t count) {
  constexpr size_t kAlignment = 256;
  const size_t bytes = (count * sizeof(float) + kAlignment) / kAlignment * kAlignment;
  return {static_cast<float*>(std::aligned_alloc(kAlignment, bytes)), std::free};
}

// Runs barrier check `name` (broken or not) with `seed`: (cudaError_t, message, values written).
std::tuple<int, std::string, std::vector<float>> RunBarrierCheck(const std::string& name, bool broken, uint64_t seed,
                                                                 double barrier_seconds) {
  auto found = kBarrierChecks.find(name);
  if (found == kBarrierChecks.end()) throw std::invalid_argument("no barrier check named '" + name + "'");
  auto [kernel, blocks] = found->second;
  std::vector<float> out(size_t(blocks) * kThreads, 0.f);
  host::Options() = {seed, barrier_seconds};
  // Rotate's barrier is the one it may lack: broken means no __syncthreads.
  cudaError_t code = LaunchCooperativeGrid(kernel, blocks, kThreads, kThreads * sizeof(float), nullptr, out.data(),
                                           name == "rotate" ? !broken : broken);
  host::Options() = {};
  return {int(code), host::LastLaunchError(), out};
}

std::tuple<int, std::string, std::vector<float>> RunLoadTile(int offset, int ldm, const std::string& lanes) {
  const std::map<std::string, Lanes> named = {
      {"all", kAllLanes}, {"half_return", kHalfReturns}, {"own_pointer", kOwnPointer}};
  if (!named.count(lanes))
    throw std::invalid_argument("lanes must be all, half_return or own_pointer, got '" + lanes + "'");
  std::vector<float> out(kTile * kTile, 0.f);
  host::Options().seed = 0;
  cudaError_t code = LaunchCooperativeGrid(LoadTile, 1, kThreads, kTile * 32 * sizeof(__nv_bfloat16), nullptr,
                                           out.data(), offset, ldm, int(named.at(lanes)));
  return {int(code), host::LastLaunchError(), out};
}

// d = a b + c through the wmma calls, one warp; a, b, c float32 in memory (a, b rounded to
// bfloat16 on the device, or loaded as float and rounded with __float_to_tf32), c and d in
// `c_layout`, a and b in the fragments' layouts.
template <int K, typename Precision, typename LayoutA, typename LayoutB>
__global__ void MultiplyTiles(const float* a, const float* b, const float* c, float* d, wmma::layout_t c_layout,
                              __nv_bfloat16* staging) {
  constexpr bool bf16 = std::is_same_v<Precision, __nv_bfloat16>;
  wmma::fragment<wmma::matrix_a, kTile, kTile, K, Precision, LayoutA> fa;
  wmma::fragment<wmma::matrix_b, kTile, kTile, K, Precision, LayoutB> fb;
  wmma::fragment<wmma::accumulator, kTile, kTile, K, float> fc;
  const unsigned lda = std::is_same_v<LayoutA, wmma::row_major> ? K : kTile;
  const unsigned ldb = std::is_same_v<LayoutB, wmma::row_major> ? kTile : K;
  if constexpr (bf16) {
    for (int i = threadIdx.x; i < kTile * K; i += blockDim.x) staging[i] = __float2bfloat16(a[i]);
    for (int i = threadIdx.x; i < K * kTile; i += blockDim.x) staging[kTile * K + i] = __float2bfloat16(b[i]);
    __syncwarp();
    wmma::load_matrix_sync(fa, staging, lda);
    wmma::load_matrix_sync(fb, staging + kTile * K, ldb);
  } else {
    wmma::load_matrix_sync(fa, a, lda);
    wmma::load_matrix_sync(fb, b, ldb);
    for (int i = 0; i < fa.num_elements; ++i) fa.x[i] = wmma::__float_to_tf32(fa.x[i]);
    for (int i = 0; i < fb.num_elements; ++i) fb.x[i] = wmma::__float_to_tf32(fb.x[i]);
  }
  wmma::load_matrix_sync(fc, c, kTile, c_layout);
  wmma::mma_sync(fc, fa, fb, fc);
  wmma::store_matrix_sync(d, fc, kTile, c_layout);
}

template <int K, typename Precision, typename LayoutA, typename LayoutB>
void Multiply(const float* a, const float* b, const float* c, float* d, wmma::layout_t c_layout) {
  auto staging = Aligned(kTile * K);  // 2 * 16 * K bfloat16
  auto code = LaunchCooperativeGrid(MultiplyTiles<K, Precision, LayoutA, LayoutB>, 1, 32, 0, nullptr, a, b, c, d,
                                    c_layout, reinterpret_cast<__nv_bfloat16*>(staging.get()));
  if (code != cudaSuccess) throw std::runtime_error("MultiplyTiles: " + host::LastLaunchError());
}

// precision "bfloat16" (k 16) or "tf32" (k 8); a is [16, k] stored in layout_a ("row" or "col"),
// b [k, 16] in layout_b, c [16, 16] in layout_c; returns d in layout_c.
std::vector<float> MultiplyTilesOnHost(const std::string& precision, const std::string& layout_a,
                                       const std::string& layout_b, const std::string& layout_c, Floats a, Floats b,
                                       Floats c) {
  const bool bf16 = precision == "bfloat16";
  if (!bf16 && precision != "tf32") throw std::invalid_argument("precision must be bfloat16 or tf32");
  const size_t k = bf16 ? 16 : 8;
  if (a.size() != kTile * k || b.size() != kTile * k || c.size() != kTile * kTile)
    throw std::invalid_argument("a must be 16 x k, b k x 16, c 16 x 16 elements");
  auto da = Aligned(a.size()), db = Aligned(b.size()), dc = Aligned(c.size()), dd = Aligned(c.size());
  std::memcpy(da.get(), a.data(), a.nbytes());
  std::memcpy(db.get(), b.data(), b.nbytes());
  std::memcpy(dc.get(), c.data(), c.nbytes());
  const wmma::layout_t c_layout = layout_c == "row" ? wmma::mem_row_major : wmma::mem_col_major;
  const int which = (layout_a == "row") * 2 + (layout_b == "row");
  using R = wmma::row_major;
  using C = wmma::col_major;
  auto run = [&](auto k_tag, auto precision_tag) {
    constexpr int K = decltype(k_tag)::value;
    using P = decltype(precision_tag);
    switch (which) {
      case 3: return Multiply<K, P, R, R>(da.get(), db.get(), dc.get(), dd.get(), c_layout);
      case 2: return Multiply<K, P, R, C>(da.get(), db.get(), dc.get(), dd.get(), c_layout);
      case 1: return Multiply<K, P, C, R>(da.get(), db.get(), dc.get(), dd.get(), c_layout);
      default: return Multiply<K, P, C, C>(da.get(), db.get(), dc.get(), dd.get(), c_layout);
    }
  };
  if (bf16) run(std::integral_constant<int, 16>(), __nv_bfloat16());
  else run(std::integral_constant<int, 8>(), wmma::precision::tf32());
  return std::vector<float>(dd.get(), dd.get() + c.size());
}

// The shim's roundings element-wise: bfloat16 bits, and tf32 values.
std::vector<uint16_t> RoundToBfloat16(Floats x) {
  std::vector<uint16_t> bits(x.size());
  for (size_t i = 0; i < x.size(); ++i) bits[i] = __float2bfloat16(x.data()[i]).bits;
  return bits;
}

std::vector<float> Bfloat16ToFloat(Bits x) {
  std::vector<float> values(x.size());
  for (size_t i = 0; i < x.size(); ++i) values[i] = __bfloat162float(__nv_bfloat16{x.data()[i]});
  return values;
}

std::vector<float> RoundToTf32(Floats x) {
  std::vector<float> values(x.size());
  for (size_t i = 0; i < x.size(); ++i) values[i] = wmma::__float_to_tf32(x.data()[i]);
  return values;
}

}  // namespace

void DefineShimChecks(nb::module_& module) {
  module.def("barrier_check", &RunBarrierCheck, nb::arg("name"), nb::arg("broken"), nb::arg("seed"),
             nb::arg("barrier_seconds") = host::LaunchOptions().barrier_seconds,
             "Runs a small kernel, broken or correct: (cudaError_t, the launch's message, the values written).");
  module.def("load_tile", &RunLoadTile, nb::arg("offset"), nb::arg("ldm"), nb::arg("lanes"),
             "A wmma bfloat16 load from shared memory at `offset` elements with `ldm` by the lanes as `lanes` says "
             "(all, half_return, own_pointer): (cudaError_t, message, tile).");
  module.def("multiply_tiles", &MultiplyTilesOnHost, nb::arg("precision"), nb::arg("layout_a"), nb::arg("layout_b"),
             nb::arg("layout_c"), nb::arg("a"), nb::arg("b"), nb::arg("c"), "d = a b + c through the wmma shim.");
  module.def("round_to_bfloat16", &RoundToBfloat16, nb::arg("x"), "__float2bfloat16's bits, element-wise.");
  module.def("bfloat16_to_float", &Bfloat16ToFloat, nb::arg("bits"), "__bfloat162float, element-wise.");
  module.def("round_to_tf32", &RoundToTf32, nb::arg("x"), "wmma::__float_to_tf32, element-wise.");
}

}  // namespace jaxring::rnn
