// The persistent recurrent layer's launchers (persistent_rnn.cu), as the FFI handlers
// (module_rnn_cuda.cc) call them: plain host C++, the storage type passed as a value, and the
// tiling of each block's tensor-core products, which the kernels and the shared-memory sizes share.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#ifdef __CUDACC__
#define JAXRING_RNN_HOST_DEVICE __host__ __device__
#else
#define JAXRING_RNN_HOST_DEVICE
#endif

namespace jaxring::rnn {

// D directions, B utterances, T frames, H units, G gates (3 for a GRU, 1 for a plain RNN); from
// jaxring/rnn/plan.py, each direction's blocks (one per SM) own a run of units of unit_groups
// runs for a run of batch_rows utterances (the last run shorter). forward_chunk and
// backward_chunk (plan.py's, multiples of kTile): how many columns of the product's left operand
// (the state going forward, the recurrent input's gradient going backward) a block stages in
// shared memory at once.
struct Shape {
  int directions, batch, frames, hidden, gates, unit_groups, batch_rows;
  float relu_clip;
  int forward_chunk, backward_chunk;
};

JAXRING_RNN_HOST_DEVICE inline int BatchGroups(const Shape& s) { return (s.batch + s.batch_rows - 1) / s.batch_rows; }
JAXRING_RNN_HOST_DEVICE inline int BlocksPerDirection(const Shape& s) { return s.unit_groups * BatchGroups(s); }

// The compute dtype of weights, inputs, states and outputs; accumulation is float32 in both.
enum class Storage { kFloat32, kBfloat16 };
inline size_t StorageBytes(Storage storage) { return storage == Storage::kBfloat16 ? 2 : 4; }

// Threads per block (jaxring/rnn/plan.py's THREADS_PER_BLOCK, checked equal by
// tests/jaxring/rnn/test_persistent_rnn_source.py, which also holds the kernels to the
// 65536 / 512 = 128 registers a thread that keep one block resident per SM).
inline constexpr int kThreadsPerBlock = 512;
inline constexpr int kWarpSize = 32;

// The tensor cores' tile edge: wmma's 16 x 16 products, operands padded with zeros to it.
inline constexpr int kTile = 16;
// Column tiles one warp multiplies per row tile, reusing its left-operand fragment.
inline constexpr int kColumnTilesPerWarp = 2;

JAXRING_RNN_HOST_DEVICE inline int RoundUpToTile(int n) { return (n + kTile - 1) / kTile * kTile; }

// Row stride in shared memory of a tile-padded operand: 16 bytes past the tile multiple, so the
// eight 16-byte rows a tensor-core load reads fall in different banks; rows stay 32-byte
// aligned at tile boundaries, as wmma requires.
JAXRING_RNN_HOST_DEVICE inline int PaddedLead(int n, int element_bytes) {
  return RoundUpToTile(n) + 16 / element_bytes;
}

// One block's product sums[B, N] = left[B, K] x weights[K, N], in float32. Its warps take
// items: a row tile, a group of kColumnTilesPerWarp column tiles, and a share (split) of each
// staged chunk's depth steps, so a few row tiles (small batch) still keep every warp busy. Each
// split's partial sums go to their own [B, N] slice of shared memory; the cell adds them up.
struct Tiling {
  int rows, row_tiles, columns, column_tiles, column_groups, depth, chunk, splits;
  JAXRING_RNN_HOST_DEVICE Tiling(int batch, int depth_, int outputs, int chunk_, int warps)
      : rows(RoundUpToTile(batch)), row_tiles(rows / kTile), columns(RoundUpToTile(outputs)),
        column_tiles(columns / kTile), column_groups((column_tiles + kColumnTilesPerWarp - 1) / kColumnTilesPerWarp),
        depth(RoundUpToTile(depth_)), chunk(chunk_) {
    int tiles = row_tiles * column_groups, by_warps = warps / tiles, steps = chunk / kTile;
    splits = by_warps < 1 ? 1 : (by_warps < steps ? by_warps : steps);
  }
  JAXRING_RNN_HOST_DEVICE int Items() const { return row_tiles * column_groups * splits; }
  JAXRING_RNN_HOST_DEVICE size_t StagedBytes(int element_bytes) const {
    return size_t(rows) * PaddedLead(chunk, element_bytes) * element_bytes;
  }
  JAXRING_RNN_HOST_DEVICE size_t SumsBytes() const { return size_t(splits) * rows * columns * sizeof(float); }
  // The weights as the forward pass holds them, [depth][PaddedLead(columns)] (the kernel's
  // columns, row major), or as the backward pass does, [columns][PaddedLead(depth)] (its rows).
  JAXRING_RNN_HOST_DEVICE int RowMajorLead(int element_bytes) const { return PaddedLead(columns, element_bytes); }
  JAXRING_RNN_HOST_DEVICE int ColumnMajorLead(int element_bytes) const { return PaddedLead(depth, element_bytes); }
  JAXRING_RNN_HOST_DEVICE size_t RowMajorWeightBytes(int element_bytes) const {
    return size_t(depth) * RowMajorLead(element_bytes) * element_bytes;
  }
  JAXRING_RNN_HOST_DEVICE size_t ColumnMajorWeightBytes(int element_bytes) const {
    return size_t(columns) * ColumnMajorLead(element_bytes) * element_bytes;
  }
};

JAXRING_RNN_HOST_DEVICE inline int MaxUnits(const Shape& s) { return (s.hidden + s.unit_groups - 1) / s.unit_groups; }
// Going forward a block multiplies its rows of the state [rows, H] by its G x units kernel
// columns; going backward its rows of the recurrent input's gradient [rows, G * H] by its units'
// kernel rows, transposed.
JAXRING_RNN_HOST_DEVICE inline Tiling ForwardTiling(const Shape& s, int warps) {
  return Tiling(s.batch_rows, s.hidden, s.gates * MaxUnits(s), s.forward_chunk, warps);
}
JAXRING_RNN_HOST_DEVICE inline Tiling BackwardTiling(const Shape& s, int warps) {
  return Tiling(s.batch_rows, s.gates * s.hidden, MaxUnits(s), s.backward_chunk, warps);
}

// Dynamic shared memory per block: plan.Plan.forward_bytes and backward_bytes.
size_t ForwardSharedBytes(const Shape& s, Storage storage);
size_t BackwardSharedBytes(const Shape& s, Storage storage);

// Saved values per frame and utterance for the backward pass: host_mirror.saved_width.
JAXRING_RNN_HOST_DEVICE inline int SavedWidth(const Shape& s) { return s.gates == 3 ? 4 * s.hidden : s.hidden; }

// One cooperative launch over both directions' sequences (layouts in persistent_rnn_kernels.cuh).
// states[d][0] must be zero on entry.
cudaError_t LaunchForward(cudaStream_t stream, const Shape& s, Storage storage, const void* kernels,
                          const void* biases, const void* projected, const bool* mask, void* outputs,
                          void* states, float* saved);
cudaError_t LaunchBackward(cudaStream_t stream, const Shape& s, Storage storage, const void* kernels,
                           const bool* mask, const void* states, const float* saved, const void* d_outputs,
                           void* d_recurrent, void* d_projected);

}  // namespace jaxring::rnn
