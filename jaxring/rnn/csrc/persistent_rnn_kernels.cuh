// The persistent recurrent layer's kernels: one cooperative launch per pass over a layer's
// whole sequence, both directions at once, each block's weights in shared memory, each frame's
// product on the tensor cores (wmma), accumulating in float32.
//
// Device code only, written against kernel_platform.cuh, so the same source is compiled by
// nvcc for the GPU (persistent_rnn.cu launches it) and by the host compiler for the tests.
// The split, buffers and barriers are jaxring/rnn/host_mirror.py's, which the tests prove
// against the model's scan on the host; jaxring/rnn/plan.py decides the block count and the
// staged chunks, and that the shared memory asked for here fits (docs/PERSISTENT_RNN.md).
//
// Layouts, D directions, B utterances, T frames, H units, G gates (3 for a GRU, 1 for a plain
// RNN), W = G * H: kernels [D, H, W], biases [D, W], projected [D, B, T, W], mask [D, B, T],
// outputs [D, B, T, H], states [D, T + 1, B, H] (states[d][0] zero), saved [D, T, B, S] float
// with S = 4H for a GRU (reset, update, candidate, candidate's recurrent term), H for an RNN;
// backward, d_recurrent [D, T, B, W] (each frame's gradient of the recurrent input, the
// kernel's product with the state) and d_projected [D, B, T, W], both in the compute dtype.
#pragma once

#include "kernel_platform.cuh"
#include "persistent_rnn.h"

namespace jaxring::rnn {

namespace wmma = nvcuda::wmma;

__device__ inline float ToFloat(float x) { return x; }
__device__ inline float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ inline T FromFloat(float x);
template <> __device__ inline float FromFloat<float>(float x) { return x; }
template <> __device__ inline __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

__device__ inline float Sigmoid(float x) { return 1.f / (1.f + __expf(-x)); }

// What this block owns (plan.Plan.units and rows): its direction, a run of units (plan.split_units:
// the first hidden % unit_groups runs one unit longer) and a run of utterances.
struct Block {
  int direction, start, count, first_row, rows;
  __device__ explicit Block(const Shape& s) {
    const int per_direction = BlocksPerDirection(s), block = blockIdx.x % per_direction;
    const int group = block % s.unit_groups, base = s.hidden / s.unit_groups, longer = s.hidden % s.unit_groups;
    direction = blockIdx.x / per_direction;
    start = group * base + min(group, longer);
    count = base + (group < longer);
    first_row = block / s.unit_groups * s.batch_rows;
    rows = min(s.batch, first_row + s.batch_rows) - first_row;
  }
  // Column c in [0, G * count) of the block's slice: gate c / count, unit start + c % count.
  __device__ int Column(const Shape& s, int c) const { return (c / count) * s.hidden + start + c % count; }
};

// The tensor-core product per storage type. bfloat16: m16n16k16 with bfloat16 inputs. float32:
// TF32 m16n16k8 (inputs rounded to 10 mantissa bits, float32 accumulation), which is what the
// float32 baselines use on Ampere and Hopper: JAX's default precision computes a float32 dot
// with TF32 on recent GPUs, and PyTorch lets cuDNN (its RNNs included) use TF32 by default
// (torch.backends.cudnn.allow_tf32 = True; only torch.backends.cuda.matmul.allow_tf32 is off).
// docs/PERSISTENT_RNN.md ("Dtypes") says where each is documented.
template <typename T> struct TensorCore;
template <> struct TensorCore<__nv_bfloat16> {
  static constexpr int kDepth = 16;
  using Input = __nv_bfloat16;
};
template <> struct TensorCore<float> {
  static constexpr int kDepth = 8;
  using Input = wmma::precision::tf32;
};

template <typename T>
using Accumulator = wmma::fragment<wmma::accumulator, kTile, kTile, TensorCore<T>::kDepth, float>;
template <typename T, typename Use, typename Layout>
using Operand = wmma::fragment<Use, kTile, kTile, TensorCore<T>::kDepth, typename TensorCore<T>::Input, Layout>;

// A TF32 fragment is loaded from float32 with all its bits: round it as the tensor cores expect.
template <typename Use, typename Layout>
__device__ inline void RoundForTensorCores(wmma::fragment<Use, kTile, kTile, 8, wmma::precision::tf32, Layout>& f) {
  for (int i = 0; i < f.num_elements; ++i) f.x[i] = wmma::__float_to_tf32(f.x[i]);
}
template <typename Use, typename Layout>
__device__ inline void RoundForTensorCores(wmma::fragment<Use, kTile, kTile, 16, __nv_bfloat16, Layout>&) {}

// Where the weights' [k, n] tile starts: held row major ([K][lead], the kernel's columns going
// forward) or column major ([N][lead], the kernel's rows going backward).
template <typename Layout> struct WeightTile;
template <> struct WeightTile<wmma::row_major> {
  template <typename T> __device__ static const T* At(const T* weights, int lead, int k, int n) {
    return weights + size_t(k) * lead + n;
  }
};
template <> struct WeightTile<wmma::col_major> {
  template <typename T> __device__ static const T* At(const T* weights, int lead, int k, int n) {
    return weights + size_t(n) * lead + k;
  }
};

// The block's product left[batch, depth] x weights, into sums [splits][rows][columns]
// (persistent_rnn.h's Tiling; the cell adds the splits). Every thread of the block calls it.
// `left` is in global memory, written by every block before the last grid barrier: it is
// staged into shared memory `chunk` columns at a time, zero-padded to the tile (padding is
// never left to what shared memory held). `weights` is the block's operand in shared memory,
// zero-padded, with row stride `lead`.
template <typename T, typename Layout>
__device__ void BlockProduct(const Tiling& tiling, const T* left, int batch, int depth, const T* weights, int lead,
                             T* staged, float* sums) {
  const int warp = threadIdx.x / kWarpSize, warps = blockDim.x / kWarpSize;
  const int tiles = tiling.row_tiles * tiling.column_groups, staged_lead = PaddedLead(tiling.chunk, sizeof(T));
  // More items than warps (large batches or blocks) take several rounds, restaging each time.
  for (int first = 0; first < tiling.Items(); first += warps) {
    const int item = first + warp, split = item / tiles, row_tile = item % tiles % tiling.row_tiles;
    const int group = item % tiles / tiling.row_tiles, busy = item < tiling.Items();
    const int column_tiles = min(kColumnTilesPerWarp, tiling.column_tiles - group * kColumnTilesPerWarp);
    Accumulator<T> sum[kColumnTilesPerWarp];
    for (int c = 0; c < kColumnTilesPerWarp; ++c) wmma::fill_fragment(sum[c], 0.f);
    for (int k0 = 0; k0 < tiling.depth; k0 += tiling.chunk) {
      const int width = min(tiling.chunk, tiling.depth - k0);
      __syncthreads();  // the previous chunk's products are done reading `staged`
      for (int i = threadIdx.x; i < tiling.rows * width; i += blockDim.x) {
        int b = i / width, k = i % width;
        staged[b * staged_lead + k] =
            b < batch && k0 + k < depth ? left[size_t(b) * depth + k0 + k] : FromFloat<T>(0.f);
      }
      __syncthreads();
      if (!busy) continue;
      const int steps = width / kTile, end = (split + 1) * steps / tiling.splits;
      for (int step = split * steps / tiling.splits; step < end; ++step)
        for (int part = 0; part < kTile; part += TensorCore<T>::kDepth) {
          Operand<T, wmma::matrix_a, wmma::row_major> a;
          wmma::load_matrix_sync(a, staged + row_tile * kTile * staged_lead + step * kTile + part, staged_lead);
          RoundForTensorCores(a);
          for (int c = 0; c < kColumnTilesPerWarp; ++c) {
            if (c >= column_tiles) break;
            Operand<T, wmma::matrix_b, Layout> b;
            const int k = k0 + step * kTile + part, n = (group * kColumnTilesPerWarp + c) * kTile;
            wmma::load_matrix_sync(b, WeightTile<Layout>::At(weights, lead, k, n), lead);
            RoundForTensorCores(b);
            wmma::mma_sync(sum[c], a, b, sum[c]);
          }
        }
    }
    if (!busy) continue;
    for (int c = 0; c < kColumnTilesPerWarp; ++c) {
      if (c >= column_tiles) break;
      float* tile = sums + (size_t(split) * tiling.rows + row_tile * kTile) * tiling.columns +
                    (group * kColumnTilesPerWarp + c) * kTile;
      wmma::store_matrix_sync(tile, sum[c], tiling.columns, wmma::mem_row_major);
    }
  }
  __syncthreads();  // every split's sums are stored
}

// Output (b, c) of BlockProduct: its splits added up.
__device__ inline float ProductAt(const Tiling& tiling, const float* sums, int b, int c) {
  float total = 0;
  for (int split = 0; split < tiling.splits; ++split)
    total += sums[(size_t(split) * tiling.rows + b) * tiling.columns + c];
  return total;
}

// Each block multiplies its utterances' rows of the state by its units' kernel columns.
// Shared memory: sums [splits][rows][columns] float, the block's kernel columns
// [depth][RowMajorLead], the staged state [rows][PaddedLead(chunk)] (ForwardSharedBytes).
template <typename T>
__global__ void PersistentForward(Shape s, const T* kernels, const T* biases, const T* projected,
                                  const bool* mask, T* outputs, T* states, float* saved) {
  cg::grid_group grid = cg::this_grid();
  const Block block(s);
  const int d = block.direction, H = s.hidden, W = s.gates * H, columns = s.gates * block.count, S = SavedWidth(s);
  const Tiling tiling = ForwardTiling(s, blockDim.x / kWarpSize);
  const int lead = tiling.RowMajorLead(sizeof(T));
  unsigned char* shared = DynamicShared();
  float* sums = reinterpret_cast<float*>(shared);
  T* weights = reinterpret_cast<T*>(shared + tiling.SumsBytes());
  T* staged = reinterpret_cast<T*>(shared + tiling.SumsBytes() + tiling.RowMajorWeightBytes(sizeof(T)));
  for (int i = threadIdx.x; i < tiling.depth * lead; i += blockDim.x) {
    int k = i / lead, c = i % lead;
    weights[i] = k < H && c < columns ? kernels[(size_t(d) * H + k) * W + block.Column(s, c)] : FromFloat<T>(0.f);
  }
  for (int t = 0; t < s.frames; ++t) {
    const T* h_prev = states + (size_t(d) * (s.frames + 1) + t) * s.batch * H;
    T* h_next = states + (size_t(d) * (s.frames + 1) + t + 1) * s.batch * H;
    BlockProduct<T, wmma::row_major>(tiling, h_prev + size_t(block.first_row) * H, block.rows, H, weights, lead, staged,
                                     sums);
    for (int i = threadIdx.x; i < block.rows * block.count; i += blockDim.x) {
      int row = i / block.count, b = block.first_row + row, u = i % block.count, unit = block.start + u;
      const T* x = projected + ((size_t(d) * s.batch + b) * s.frames + t) * W;
      float* keep = saved + ((size_t(d) * s.frames + t) * s.batch + b) * S;
      const T* bias = biases + size_t(d) * W;
      float h_old = ToFloat(h_prev[b * H + unit]), h_new;
      if (s.gates == 3) {
        float h_r = ProductAt(tiling, sums, row, u) + ToFloat(bias[unit]);
        float h_z = ProductAt(tiling, sums, row, block.count + u) + ToFloat(bias[H + unit]);
        float h_n = ProductAt(tiling, sums, row, 2 * block.count + u) + ToFloat(bias[2 * H + unit]);
        float reset = Sigmoid(ToFloat(x[unit]) + h_r);
        float update = Sigmoid(ToFloat(x[H + unit]) + h_z);
        float candidate = tanhf(ToFloat(x[2 * H + unit]) + reset * h_n);
        h_new = (1 - update) * candidate + update * h_old;
        keep[unit] = reset, keep[H + unit] = update, keep[2 * H + unit] = candidate, keep[3 * H + unit] = h_n;
      } else {
        float pre = ToFloat(x[unit]) + ProductAt(tiling, sums, row, u) + ToFloat(bias[unit]);
        h_new = fminf(fmaxf(pre, 0.f), s.relu_clip);
        keep[unit] = pre;
      }
      bool real = mask[(size_t(d) * s.batch + b) * s.frames + t];
      h_next[b * H + unit] = FromFloat<T>(real ? h_new : h_old);
      outputs[((size_t(d) * s.batch + b) * s.frames + t) * H + unit] = FromFloat<T>(real ? h_new : 0.f);
    }
    // Every block reads all of frame t + 1's state next: the grid barrier also orders the stores.
    // Each frame's state has its own slot, so this one barrier per frame suffices.
    grid.sync();
  }
}

// Per frame, from the last: the gate gradients of the block's units, written to the frame's
// own slot of d_recurrent (so one barrier per frame suffices: no slot is ever rewritten), the
// barrier, then the gradient of its units' previous state, d_recurrent(t) x its kernel rows^T,
// on the tensor cores. The kernel and bias gradients are sums over all frames of d_recurrent,
// which jaxring/rnn/layer.py takes as one large product off this sequential path.
// Shared memory: sums [splits][rows][columns] float, the block's kernel rows
// [columns][ColumnMajorLead], the staged gradient [rows][PaddedLead(chunk)], the carried
// gradient [its rows, units] float (BackwardSharedBytes).
template <typename T>
__global__ void PersistentBackward(Shape s, const T* kernels, const bool* mask, const T* states,
                                   const float* saved, const T* d_outputs, T* d_recurrent, T* d_projected) {
  cg::grid_group grid = cg::this_grid();
  const Block block(s);
  const int d = block.direction, H = s.hidden, W = s.gates * H, S = SavedWidth(s);
  const Tiling tiling = BackwardTiling(s, blockDim.x / kWarpSize);
  const int lead = tiling.ColumnMajorLead(sizeof(T));
  unsigned char* shared = DynamicShared();
  const size_t weights_at = tiling.SumsBytes(), staged_at = weights_at + tiling.ColumnMajorWeightBytes(sizeof(T));
  float* sums = reinterpret_cast<float*>(shared);
  T* weight_rows = reinterpret_cast<T*>(shared + weights_at);
  T* staged = reinterpret_cast<T*>(shared + staged_at);
  float* d_h = reinterpret_cast<float*>(shared + staged_at + tiling.StagedBytes(sizeof(T)));
  for (int i = threadIdx.x; i < tiling.columns * lead; i += blockDim.x) {
    int u = i / lead, k = i % lead;
    weight_rows[i] = u < block.count && k < W ? kernels[(size_t(d) * H + block.start + u) * W + k] : FromFloat<T>(0.f);
  }
  for (int i = threadIdx.x; i < block.rows * block.count; i += blockDim.x) d_h[i] = 0;
  for (int t = s.frames - 1; t >= 0; --t) {
    const T* h_prev = states + (size_t(d) * (s.frames + 1) + t) * s.batch * H;
    T* recurrent = d_recurrent + (size_t(d) * s.frames + t) * s.batch * W;
    // Each thread keeps the same (utterance, unit) pairs of d_h in both loops: no block barrier between.
    for (int i = threadIdx.x; i < block.rows * block.count; i += blockDim.x) {
      int b = block.first_row + i / block.count, u = i % block.count, unit = block.start + u;
      bool real = mask[(size_t(d) * s.batch + b) * s.frames + t];
      size_t frame = (size_t(d) * s.batch + b) * s.frames + t;
      float grad = d_h[i] + (real ? ToFloat(d_outputs[frame * H + unit]) : 0.f);
      const float* keep = saved + ((size_t(d) * s.frames + t) * s.batch + b) * S;
      T* rec = recurrent + size_t(b) * W;
      T* d_x = d_projected + frame * W;
      if (s.gates == 3) {
        float reset = keep[unit], update = keep[H + unit], candidate = keep[2 * H + unit], h_n = keep[3 * H + unit];
        float d_candidate = real ? grad * (1 - update) * (1 - candidate * candidate) : 0.f;
        float d_update = real ? grad * (ToFloat(h_prev[b * H + unit]) - candidate) * update * (1 - update) : 0.f;
        float d_reset = d_candidate * h_n * reset * (1 - reset);
        rec[unit] = FromFloat<T>(d_reset), rec[H + unit] = FromFloat<T>(d_update);
        rec[2 * H + unit] = FromFloat<T>(d_candidate * reset);
        d_x[unit] = FromFloat<T>(d_reset), d_x[H + unit] = FromFloat<T>(d_update);
        d_x[2 * H + unit] = FromFloat<T>(d_candidate);
        d_h[i] = real ? grad * update : grad;  // the direct path; the recurrent one is added after the barrier
      } else {
        float pre = keep[unit];
        float d_pre = real && pre > 0.f && pre < s.relu_clip ? grad : 0.f;
        rec[unit] = FromFloat<T>(d_pre);
        d_x[unit] = FromFloat<T>(d_pre);
        d_h[i] = real ? 0.f : grad;
      }
    }
    grid.sync();  // every block's columns of frame t's recurrent gradient are written
    BlockProduct<T, wmma::col_major>(tiling, recurrent + size_t(block.first_row) * W, block.rows, W, weight_rows, lead,
                                     staged, sums);
    for (int i = threadIdx.x; i < block.rows * block.count; i += blockDim.x)
      d_h[i] += ProductAt(tiling, sums, i / block.count, i % block.count);
  }
}

}  // namespace jaxring::rnn
