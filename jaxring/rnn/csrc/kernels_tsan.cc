// The persistent layer's kernels on the host shim as a program of its own, for ThreadSanitizer
// (scripts/dev/sanitize_rnn_kernels.py builds it with -fsanitize=thread). The shim runs each block on
// an OS thread, so TSan sees every access one block makes to another's data; within a block the
// fibers' order is the shim's business (the tests' seeds), and each switch is a synchronisation.
//
//   kernels_tsan kernels   forward and backward launches over a few shapes, storages and seeds:
//                          TSan must stay silent, every output finite (written)
//   kernels_tsan race      a kernel whose block 1 reads what block 0 writes with no grid.sync
//                          between: TSan must report it (the check that TSan watches the blocks)
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernel_platform.cuh"
#include "persistent_rnn.h"

namespace jaxring::rnn {
namespace {

__global__ void UnorderedPublish(float* cell, float* seen) {
  if (blockIdx.x == 0 && threadIdx.x == 0) cell[0] = 1;
  if (blockIdx.x == 1 && threadIdx.x == 0) seen[0] = cell[0];
}

// Storage-sized random values: float32, or bfloat16 bits.
std::vector<unsigned char> Random(std::mt19937& random, size_t count, Storage storage, float scale) {
  std::normal_distribution<float> normal(0.f, scale);
  std::vector<unsigned char> bytes(count * StorageBytes(storage));
  for (size_t i = 0; i < count; ++i) {
    float value = normal(random);
    if (storage == Storage::kBfloat16) {
      __nv_bfloat16 rounded = __float2bfloat16(value);
      std::memcpy(bytes.data() + 2 * i, &rounded, 2);
    } else {
      std::memcpy(bytes.data() + 4 * i, &value, 4);
    }
  }
  return bytes;
}

bool AllFinite(const std::vector<unsigned char>& bytes, Storage storage) {
  for (size_t i = 0; i < bytes.size() / StorageBytes(storage); ++i) {
    float value;
    if (storage == Storage::kBfloat16) {
      __nv_bfloat16 bits;
      std::memcpy(&bits, bytes.data() + 2 * i, 2);
      value = __bfloat162float(bits);
    } else {
      std::memcpy(&value, bytes.data() + 4 * i, 4);
    }
    if (!std::isfinite(value)) return false;
  }
  return true;
}

// One forward and backward launch pair; false (with a line on stderr) if a launch fails or leaves
// an output unwritten.
bool RunPair(const Shape& s, Storage storage, uint64_t seed) {
  std::mt19937 random(unsigned(seed) + 7);
  const size_t D = s.directions, B = s.batch, T = s.frames, H = s.hidden, W = size_t(s.gates) * H;
  const size_t e = StorageBytes(storage);
  auto kernels = Random(random, D * H * W, storage, 1.f / std::sqrt(float(H)));
  auto biases = Random(random, D * W, storage, 0.3f), projected = Random(random, D * B * T * W, storage, 1.f);
  auto d_outputs = Random(random, D * B * T * H, storage, 1.f);
  std::vector<unsigned char> mask(D * B * T);
  for (size_t i = 0; i < mask.size(); ++i) mask[i] = (i % T) < T - (i / T) % 3;  // ragged lengths
  std::vector<unsigned char> outputs(D * B * T * H * e), states(D * (T + 1) * B * H * e, 0);
  std::vector<unsigned char> d_projected(D * B * T * W * e), d_recurrent(D * T * B * W * e);
  std::vector<float> saved(D * T * B * SavedWidth(s));
  host::Options().seed = seed;
  const bool* real = reinterpret_cast<const bool*>(mask.data());
  const char* failed = nullptr;
  if (LaunchForward(nullptr, s, storage, kernels.data(), biases.data(), projected.data(), real, outputs.data(),
                    states.data(), saved.data()) != cudaSuccess)
    failed = "LaunchForward";
  else if (LaunchBackward(nullptr, s, storage, kernels.data(), real, states.data(), saved.data(), d_outputs.data(),
                          d_recurrent.data(), d_projected.data()) != cudaSuccess)
    failed = "LaunchBackward";
  if (failed) {
    std::fprintf(stderr, "%s failed: %s\n", failed, host::LastLaunchError().c_str());
    return false;
  }
  const bool finite = AllFinite(outputs, storage) && AllFinite(d_projected, storage) &&
                      AllFinite(d_recurrent, storage);
  if (!finite) std::fprintf(stderr, "gates %d hidden %d: an output is not finite (unwritten?)\n", s.gates, s.hidden);
  return finite;
}

}  // namespace
}  // namespace jaxring::rnn

int main(int argc, char** argv) {
  using namespace jaxring::rnn;
  const std::string mode = argc > 1 ? argv[1] : "kernels";
  if (mode == "race") {
    float cell = 0, seen = -1;
    LaunchCooperativeGrid(UnorderedPublish, 2, 32, 0, nullptr, &cell, &seen);
    std::printf("race kernel ran: block 1 saw %g\n", seen);
    return 0;
  }
  if (mode != "kernels") {
    std::fprintf(stderr, "usage: %s [kernels|race]\n", argv[0]);
    return 2;
  }
  // {D, B, T, H, G, unit_groups, batch_rows, relu_clip, forward_chunk, backward_chunk}, as plan.py could give;
  // the last splits its batch into two runs of utterances.
  const Shape shapes[] = {{2, 3, 5, 13, 3, 4, 3, 1.5f, 16, 16}, {2, 4, 6, 9, 1, 3, 4, 1.5f, 16, 16},
                          {1, 2, 4, 7, 3, 1, 2, 1.5f, 16, 32}, {1, 20, 3, 7, 3, 2, 16, 1.5f, 16, 16}};
  int launches = 0, bad = 0;
  for (const Shape& s : shapes)
    for (Storage storage : {Storage::kFloat32, Storage::kBfloat16})
      for (uint64_t seed : {0, 1}) {
        bad += !RunPair(s, storage, seed);
        launches += 2;
      }
  std::printf("%d launches, %d failed or left outputs unwritten\n", launches, bad);
  return bad ? 1 : 0;
}
