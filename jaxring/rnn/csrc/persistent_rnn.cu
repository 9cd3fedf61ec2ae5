// The persistent recurrent layer's launchers: the kernels of persistent_rnn_kernels.cuh, one
// cooperative launch per pass, the shared memory sized as jaxring/rnn/plan.py sizes it. XLA
// calls the launchers through the FFI handlers of module_rnn_cuda.cc.

#include "persistent_rnn_kernels.cuh"

namespace jaxring::rnn {

namespace {

int Blocks(const Shape& s) { return s.directions * BlocksPerDirection(s); }

template <typename T>
cudaError_t ForwardTyped(cudaStream_t stream, const Shape& s, const T* kernels, const T* biases, const T* projected,
                         const bool* mask, T* outputs, T* states, float* saved, size_t bytes) {
  return LaunchCooperativeGrid(PersistentForward<T>, Blocks(s), kThreadsPerBlock, bytes, stream, s, kernels, biases,
                               projected, mask, outputs, states, saved);
}

template <typename T>
cudaError_t BackwardTyped(cudaStream_t stream, const Shape& s, const T* kernels, const bool* mask, const T* states,
                          const float* saved, const T* d_outputs, T* d_recurrent, T* d_projected, size_t bytes) {
  return LaunchCooperativeGrid(PersistentBackward<T>, Blocks(s), kThreadsPerBlock, bytes, stream, s, kernels, mask,
                               states, saved, d_outputs, d_recurrent, d_projected);
}

constexpr int kWarps = kThreadsPerBlock / kWarpSize;

}  // namespace

// The kernels' shared-memory layouts (persistent_rnn_kernels.cuh), region by region.
size_t ForwardSharedBytes(const Shape& s, Storage storage) {
  const int bytes = int(StorageBytes(storage));
  const Tiling tiling = ForwardTiling(s, kWarps);
  return tiling.SumsBytes() + tiling.RowMajorWeightBytes(bytes) + tiling.StagedBytes(bytes);
}

size_t BackwardSharedBytes(const Shape& s, Storage storage) {
  const int bytes = int(StorageBytes(storage));
  const Tiling tiling = BackwardTiling(s, kWarps);
  return tiling.SumsBytes() + tiling.ColumnMajorWeightBytes(bytes) + tiling.StagedBytes(bytes) +
         size_t(s.batch_rows) * MaxUnits(s) * sizeof(float);
}

cudaError_t LaunchForward(cudaStream_t stream, const Shape& s, Storage storage, const void* kernels,
                          const void* biases, const void* projected, const bool* mask, void* outputs,
                          void* states, float* saved) {
  size_t bytes = ForwardSharedBytes(s, storage);
  if (storage == Storage::kBfloat16) {
    using T = __nv_bfloat16;
    return ForwardTyped<T>(stream, s, static_cast<const T*>(kernels), static_cast<const T*>(biases),
                           static_cast<const T*>(projected), mask, static_cast<T*>(outputs), static_cast<T*>(states),
                           saved, bytes);
  }
  return ForwardTyped<float>(stream, s, static_cast<const float*>(kernels), static_cast<const float*>(biases),
                             static_cast<const float*>(projected), mask, static_cast<float*>(outputs),
                             static_cast<float*>(states), saved, bytes);
}

cudaError_t LaunchBackward(cudaStream_t stream, const Shape& s, Storage storage, const void* kernels,
                           const bool* mask, const void* states, const float* saved, const void* d_outputs,
                           void* d_recurrent, void* d_projected) {
  size_t bytes = BackwardSharedBytes(s, storage);
  if (storage == Storage::kBfloat16) {
    using T = __nv_bfloat16;
    return BackwardTyped<T>(stream, s, static_cast<const T*>(kernels), mask, static_cast<const T*>(states), saved,
                            static_cast<const T*>(d_outputs), static_cast<T*>(d_recurrent),
                            static_cast<T*>(d_projected), bytes);
  }
  return BackwardTyped<float>(stream, s, static_cast<const float*>(kernels), mask, static_cast<const float*>(states),
                              saved, static_cast<const float*>(d_outputs), static_cast<float*>(d_recurrent),
                              static_cast<float*>(d_projected), bytes);
}

}  // namespace jaxring::rnn
