// The persistent recurrent layer's launchers (persistent_rnn.cu), as the FFI handlers
// (module_rnn_cuda.cc) call them: plain host C++, the storage type passed as a value.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#ifdef __CUDACC__
#define JAXRING_RNN_HOST_DEVICE __host__ __device__
#else
#define JAXRING_RNN_HOST_DEVICE
#endif

namespace jaxring::rnn {

// D directions, B utterances, T frames, H units, G gates (3 for a GRU, 1 for a plain RNN);
// blocks_per_direction from jaxring/rnn/plan.py, one block per SM.
struct Shape {
  int directions, batch, frames, hidden, gates, blocks_per_direction;
  float relu_clip;
};

// The compute dtype of weights, inputs, states and outputs; accumulation is float32 in both.
enum class Storage { kFloat32, kBfloat16 };
inline size_t StorageBytes(Storage storage) { return storage == Storage::kBfloat16 ? 2 : 4; }

// Threads per block: 64 registers each (the kernels' ceiling, checked by
// tests/jaxring/rnn/test_persistent_rnn_source.py) is half an SM's register file, so a block
// always fits an SM; the shared memory plan.py sized is what limits the blocks to one per SM.
inline constexpr int kThreadsPerBlock = 512;

// Dynamic shared memory per block: plan.Plan.forward_bytes and backward_bytes.
size_t ForwardSharedBytes(const Shape& s, Storage storage);
size_t BackwardSharedBytes(const Shape& s, Storage storage);

// Saved values per frame and utterance for the backward pass: host_mirror.saved_width.
JAXRING_RNN_HOST_DEVICE inline int SavedWidth(const Shape& s) { return s.gates == 3 ? 4 * s.hidden : s.hidden; }

// One cooperative launch over both directions' sequences (layouts in persistent_rnn.cu).
// states[d][0] must be zero, d_biases zero on entry; d_recurrent is [D, 2, B, G * H] float scratch.
cudaError_t LaunchForward(cudaStream_t stream, const Shape& s, Storage storage, const void* kernels,
                          const void* biases, const void* projected, const bool* mask, void* outputs,
                          void* states, float* saved);
cudaError_t LaunchBackward(cudaStream_t stream, const Shape& s, Storage storage, const void* kernels,
                           const bool* mask, const void* states, const float* saved, const void* d_outputs,
                           float* d_recurrent, float* d_kernels, float* d_biases, void* d_projected);

}  // namespace jaxring::rnn
