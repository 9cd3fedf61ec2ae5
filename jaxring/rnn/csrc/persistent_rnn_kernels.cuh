// The persistent recurrent layer's kernels: one cooperative launch per pass over a layer's
// whole sequence, both directions at once, each block's weights in shared memory.
//
// Device code only, written against kernel_platform.cuh, so the same source is compiled by
// nvcc for the GPU (persistent_rnn.cu launches it) and by the host compiler for the tests.
// The split, buffers and barriers are jaxring/rnn/host_mirror.py's, which the tests prove
// against the model's scan on the host; jaxring/rnn/plan.py decides the block count and that
// the shared memory asked for here fits (docs/PERSISTENT_RNN.md).
//
// Layouts, D directions, B utterances, T frames, H units, G gates (3 for a GRU, 1 for a plain
// RNN), W = G * H: kernels [D, H, W], biases [D, W], projected [D, B, T, W], mask [D, B, T],
// outputs [D, B, T, H], states [D, T + 1, B, H] (states[d][0] zero), saved [D, T, B, S] float
// with S = 4H for a GRU (reset, update, candidate, candidate's recurrent term), H for an RNN.
#pragma once

#include "kernel_platform.cuh"
#include "persistent_rnn.h"

namespace jaxring::rnn {

__device__ inline float ToFloat(float x) { return x; }
__device__ inline float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ inline T FromFloat(float x);
template <> __device__ inline float FromFloat<float>(float x) { return x; }
template <> __device__ inline __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

__device__ inline float Sigmoid(float x) { return 1.f / (1.f + __expf(-x)); }

// plan.split_units: the first hidden % blocks blocks own one unit more.
struct Units {
  int start, count;
  __device__ Units(const Shape& s, int block) {
    int base = s.hidden / s.blocks_per_direction, longer = s.hidden % s.blocks_per_direction;
    start = block * base + min(block, longer);
    count = base + (block < longer);
  }
  // Column c in [0, G * count) of the block's slice: gate c / count, unit start + c % count.
  __device__ int Column(const Shape& s, int c) const { return (c / count) * s.hidden + start + c % count; }
};

template <typename T>
__global__ void PersistentForward(Shape s, const T* kernels, const T* biases, const T* projected,
                                  const bool* mask, T* outputs, T* states, float* saved) {
  cg::grid_group grid = cg::this_grid();
  const int d = blockIdx.x / s.blocks_per_direction;
  const Units units(s, blockIdx.x % s.blocks_per_direction);
  const int H = s.hidden, W = s.gates * H, columns = s.gates * units.count, S = SavedWidth(s);
  unsigned char* shared = DynamicShared();
  float* sums = reinterpret_cast<float*>(shared);                            // [B, columns]
  T* weights = reinterpret_cast<T*>(sums + s.batch * columns);               // [H, columns]
  for (int i = threadIdx.x; i < H * columns; i += blockDim.x) {
    int k = i / columns, c = i % columns;
    weights[i] = kernels[(size_t(d) * H + k) * W + units.Column(s, c)];
  }
  __syncthreads();
  for (int t = 0; t < s.frames; ++t) {
    const T* h_prev = states + (size_t(d) * (s.frames + 1) + t) * s.batch * H;
    T* h_next = states + (size_t(d) * (s.frames + 1) + t + 1) * s.batch * H;
    for (int i = threadIdx.x; i < s.batch * columns; i += blockDim.x) {
      int b = i / columns, c = i % columns;
      float acc = ToFloat(biases[d * W + units.Column(s, c)]);
      for (int k = 0; k < H; ++k) acc += ToFloat(h_prev[b * H + k]) * ToFloat(weights[k * columns + c]);
      sums[i] = acc;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < s.batch * units.count; i += blockDim.x) {
      int b = i / units.count, u = i % units.count, unit = units.start + u;
      const T* x = projected + ((size_t(d) * s.batch + b) * s.frames + t) * W;
      float* keep = saved + ((size_t(d) * s.frames + t) * s.batch + b) * S;
      const float* row = sums + b * columns;
      float h_old = ToFloat(h_prev[b * H + unit]), h_new;
      if (s.gates == 3) {
        float reset = Sigmoid(ToFloat(x[unit]) + row[u]);
        float update = Sigmoid(ToFloat(x[H + unit]) + row[units.count + u]);
        float h_n = row[2 * units.count + u];
        float candidate = tanhf(ToFloat(x[2 * H + unit]) + reset * h_n);
        h_new = (1 - update) * candidate + update * h_old;
        keep[unit] = reset, keep[H + unit] = update, keep[2 * H + unit] = candidate, keep[3 * H + unit] = h_n;
      } else {
        float pre = ToFloat(x[unit]) + row[u];
        h_new = fminf(fmaxf(pre, 0.f), s.relu_clip);
        keep[unit] = pre;
      }
      bool real = mask[(size_t(d) * s.batch + b) * s.frames + t];
      h_next[b * H + unit] = FromFloat<T>(real ? h_new : h_old);
      outputs[((size_t(d) * s.batch + b) * s.frames + t) * H + unit] = FromFloat<T>(real ? h_new : 0.f);
    }
    // Every block reads all of frame t + 1's state next: the grid barrier also orders the stores.
    grid.sync();
  }
}

// d_recurrent: [D, 2, B, W] float scratch, by frame parity (host_mirror.backward says why two).
template <typename T>
__global__ void PersistentBackward(Shape s, const T* kernels, const bool* mask, const T* states,
                                   const float* saved, const T* d_outputs, float* d_recurrent,
                                   float* d_kernels, float* d_biases, T* d_projected) {
  cg::grid_group grid = cg::this_grid();
  const int d = blockIdx.x / s.blocks_per_direction;
  const Units units(s, blockIdx.x % s.blocks_per_direction);
  const int H = s.hidden, W = s.gates * H, columns = s.gates * units.count, S = SavedWidth(s);
  unsigned char* shared = DynamicShared();
  float* d_weights = reinterpret_cast<float*>(shared);                       // [H, columns]
  float* d_h = d_weights + H * columns;                                      // [B, units]
  T* weight_rows = reinterpret_cast<T*>(d_h + s.batch * units.count);        // [units, W]
  for (int i = threadIdx.x; i < units.count * W; i += blockDim.x)
    weight_rows[i] = kernels[(size_t(d) * H + units.start + i / W) * W + i % W];
  for (int i = threadIdx.x; i < H * columns; i += blockDim.x) d_weights[i] = 0;
  for (int i = threadIdx.x; i < s.batch * units.count; i += blockDim.x) d_h[i] = 0;
  __syncthreads();
  for (int t = s.frames - 1; t >= 0; --t) {
    const T* h_prev = states + (size_t(d) * (s.frames + 1) + t) * s.batch * H;
    float* exchange = d_recurrent + (size_t(d) * 2 + t % 2) * s.batch * W;
    for (int i = threadIdx.x; i < s.batch * units.count; i += blockDim.x) {
      int b = i / units.count, u = i % units.count, unit = units.start + u;
      bool real = mask[(size_t(d) * s.batch + b) * s.frames + t];
      size_t frame = (size_t(d) * s.batch + b) * s.frames + t;
      float grad = d_h[i] + (real ? ToFloat(d_outputs[frame * H + unit]) : 0.f);
      const float* keep = saved + ((size_t(d) * s.frames + t) * s.batch + b) * S;
      float* rec = exchange + b * W;
      T* d_x = d_projected + frame * W;
      if (s.gates == 3) {
        float reset = keep[unit], update = keep[H + unit], candidate = keep[2 * H + unit], h_n = keep[3 * H + unit];
        float d_candidate = real ? grad * (1 - update) * (1 - candidate * candidate) : 0.f;
        float d_update = real ? grad * (ToFloat(h_prev[b * H + unit]) - candidate) * update * (1 - update) : 0.f;
        float d_reset = d_candidate * h_n * reset * (1 - reset);
        rec[unit] = d_reset, rec[H + unit] = d_update, rec[2 * H + unit] = d_candidate * reset;
        d_x[unit] = FromFloat<T>(d_reset), d_x[H + unit] = FromFloat<T>(d_update);
        d_x[2 * H + unit] = FromFloat<T>(d_candidate);
        d_h[i] = real ? grad * update : grad;  // the direct path; the recurrent one is added after the barrier
      } else {
        float pre = keep[unit];
        float d_pre = real && pre > 0.f && pre < s.relu_clip ? grad : 0.f;
        rec[unit] = d_pre;
        d_x[unit] = FromFloat<T>(d_pre);
        d_h[i] = real ? 0.f : grad;
      }
    }
    __syncthreads();  // the block's own columns of `exchange` are written
    for (int i = threadIdx.x; i < H * columns; i += blockDim.x) {
      int k = i / columns, column = units.Column(s, i % columns);
      float acc = 0;
      for (int b = 0; b < s.batch; ++b) acc += ToFloat(h_prev[b * H + k]) * exchange[b * W + column];
      d_weights[i] += acc;
    }
    for (int c = threadIdx.x; c < columns; c += blockDim.x) {
      float acc = 0;
      for (int b = 0; b < s.batch; ++b) acc += exchange[b * W + units.Column(s, c)];
      d_biases[d * W + units.Column(s, c)] += acc;  // only this block writes these columns
    }
    grid.sync();  // every block's columns of frame t's recurrent gradient are written
    for (int i = threadIdx.x; i < s.batch * units.count; i += blockDim.x) {
      int b = i / units.count, u = i % units.count;
      float acc = 0;
      for (int c = 0; c < W; ++c) acc += exchange[b * W + c] * ToFloat(weight_rows[u * W + c]);
      d_h[i] += acc;
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < H * columns; i += blockDim.x)
    d_kernels[(size_t(d) * H + i / columns) * W + units.Column(s, i % columns)] = d_weights[i];
}

}  // namespace jaxring::rnn
