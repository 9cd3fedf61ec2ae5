// ring_protocol.h under ThreadSanitizer, published as the GPU kernel
// publishes (cuda/device_ring.cu's DeviceSync): every lane is a block of
// kBlockThreads host threads that all touch the lane's data, meet at a block
// barrier, and then thread i release-stores flag i (so a flag is released by
// a thread that did not write most of the data); a waiter's thread 0
// acquire-loads and a barrier releases the rest. protocol_test_hook.cc
// publishes from the one thread that did all the accesses, which never
// exercises "barrier, then thread 0 releases".
//
// A standalone program (no Python, so TSan sees only this), built and run by
// tests/jaxring/collectives/test_protocol_tsan.py:
//   c++ -std=c++17 -O1 -g -fsanitize=thread -DJAXRING_TSAN_MUTATION=<m> protocol_tsan.cc
// Mutations, each of which must make TSan report a data race:
//   0 none; 1 no barrier before the release; 2 a relaxed store
//   instead of the release; 3 a relaxed load instead of the acquire.
// Exits 0 when every rank's output matches a float64 reference, 1 otherwise.
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/ring_protocol.h"
#include "core/ring_schedule.h"
#include "testing/host_barrier.h"

#ifndef JAXRING_TSAN_MUTATION
#define JAXRING_TSAN_MUTATION 0
#endif

namespace jaxring {
namespace {

constexpr int kBlockThreads = 4;
constexpr int64_t kRanks = 3;
constexpr int64_t kLanes = 2;
constexpr int64_t kCalls = 3;
constexpr int64_t kElements = 1003;   // odd: uneven chunks, lanes and thread strides
constexpr int64_t kSliceElements = 64;  // several slices per stage

using Word = std::atomic<uint64_t>;

// DeviceSync on host threads: `tid` is threadIdx.x, `block` the lane's barrier.
struct BlockSync {
  using Word = jaxring::Word;
  int tid;
  HostBarrier* block;  // __syncthreads() of the lane's block

  void Publish(Word* const* words, int count, uint64_t value) {
#if JAXRING_TSAN_MUTATION != 1
    block->Arrive();
#endif
#if JAXRING_TSAN_MUTATION == 2
    constexpr auto order = std::memory_order_relaxed;
#else
    constexpr auto order = std::memory_order_release;
#endif
    for (int i = tid; i < count; i += kBlockThreads) words[i]->store(value, order);
  }

  bool Wait(const Word* word, uint64_t value, uint64_t* seen) {
    if (tid == 0) {
#if JAXRING_TSAN_MUTATION == 3
      constexpr auto order = std::memory_order_relaxed;
#else
      constexpr auto order = std::memory_order_acquire;
#endif
      uint64_t v = word->load(order);
      while (v < value) {
        std::this_thread::yield();
        v = word->load(order);
      }
      *seen = v;
    }
    block->Arrive();  // no deadline here: every rank runs every call
    return true;
  }

  // As the GPU: thread i waits for words i, i + kBlockThreads, ..., then a barrier.
  bool WaitEvery(const Word* first, int64_t stride, int count, uint64_t value, int64_t*, uint64_t*) {
#if JAXRING_TSAN_MUTATION == 3
    constexpr auto order = std::memory_order_relaxed;
#else
    constexpr auto order = std::memory_order_acquire;
#endif
    for (int i = tid; i < count; i += kBlockThreads) {
      while (first[i * stride].load(order) < value) std::this_thread::yield();
    }
    block->Arrive();
    return true;
  }
};

// BlockElementwise on host threads: thread `tid` of the block takes every
// kBlockThreads-th element, as the GPU's threads stride through a lane.
struct StridedElementwise {
  int tid;
  template <typename T>
  void Copy(T* dst, const T* src, int64_t n) {
    for (int64_t i = tid; i < n; i += kBlockThreads) dst[i] = src[i];
  }
  template <typename A, typename B, typename D>
  void Add(const A* a, const B* b, D* dst, int64_t n) {
    for (int64_t i = tid; i < n; i += kBlockThreads) dst[i] = a[i] + b[i];
  }
  template <typename T>
  void SumInRankOrder(const T* const* inputs, int ranks, int64_t offset, T* dst, int64_t n) {
    for (int64_t i = tid; i < n; i += kBlockThreads) {
      T sum = inputs[0][offset + i];
      for (int p = 1; p < ranks; ++p) sum += inputs[p][offset + i];
      dst[i] = sum;
    }
  }
};

float InputOf(int64_t call, int64_t rank, int64_t i) {
  // Distinct per call, rank and element, exact in float32 sums of three.
  return static_cast<float>((call * 7 + rank * 13 + i * 5) % 97) - 48.0f;
}

enum class Path { kRing, kOneShot, kPush };

// Runs kCalls all-reduces on one path, reusing every rank's buffers from call
// to call as XLA does; returns the number of wrong elements.
int64_t RunAllReduces(Path path) {
  std::vector<std::vector<float>> in(kRanks, std::vector<float>(kElements));
  std::vector<std::vector<float>> out(kRanks, std::vector<float>(kElements));
  std::vector<RankBuffers> buffers;
  for (int64_t r = 0; r < kRanks; ++r) buffers.push_back(RankBuffers{in[r].data(), out[r].data(), out[r].data()});
  std::vector<std::unique_ptr<Word[]>> blocks;
  std::vector<Word*> block_pointers;
  for (int64_t r = 0; r < kRanks; ++r) {
    blocks.emplace_back(new Word[kFlagWords]);
    for (int i = 0; i < kFlagWords; ++i) blocks.back()[i].store(0);
    block_pointers.push_back(blocks.back().get());
  }
  // A rank's kernel ends (every lane done) before its stream moves on.
  std::vector<std::unique_ptr<HostBarrier>> kernels, lane_blocks;
  for (int64_t r = 0; r < kRanks; ++r) kernels.emplace_back(new HostBarrier(kLanes * kBlockThreads));
  for (int64_t i = 0; i < kRanks * kLanes; ++i) lane_blocks.emplace_back(new HostBarrier(kBlockThreads));
  std::atomic<int64_t> wrong{0};
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < kRanks; ++r) {
    for (int64_t lane = 0; lane < kLanes; ++lane) {
      for (int tid = 0; tid < kBlockThreads; ++tid) {
        threads.emplace_back([&, r, lane, tid] {
          const SchedulePlan plan = SchedulePlan::Make(Mode::kAllReduce, kElements, kRanks, r,
                                                       kSliceElements, 16 / sizeof(float));
          for (int64_t c = 0; c < kCalls; ++c) {
            // The stream's previous work: this call's input, written by the "host".
            if (lane == 0 && tid == 0) {
              for (int64_t i = 0; i < kElements; ++i) in[r][i] = InputOf(c, r, i);
            }
            kernels[r]->Arrive();
            BlockSync sync{tid, lane_blocks[r * kLanes + lane].get()};
            StridedElementwise ew{tid};
            const LaneCall<Word> call{kRanks, r, kLanes, lane, static_cast<uint64_t>(c + 1),
                                      block_pointers.data(), buffers.data()};
            const LaneOutcome outcome =
                path == Path::kOneShot ? RunShotLane<float>(Shot::kOneShot, plan, call, sync, ew)
                : path == Path::kPush  ? RunShotLane<float>(Shot::kPush, plan, call, sync, ew)
                                       : RunRingLane<float, float>(plan, call, sync, ew);
            if (!outcome.ok) wrong += kElements;
            kernels[r]->Arrive();
            if (lane == 0 && tid == 0) {  // the next op reads the output
              for (int64_t i = 0; i < kElements; ++i) {
                double expected = 0;
                for (int64_t p = 0; p < kRanks; ++p) expected += InputOf(c, p, i);
                if (out[r][i] != expected) ++wrong;
              }
            }
            kernels[r]->Arrive();
          }
        });
      }
    }
  }
  for (auto& t : threads) t.join();
  return wrong.load();
}

}  // namespace
}  // namespace jaxring

int main() {
  using jaxring::Path;
  const int64_t ring_wrong = jaxring::RunAllReduces(Path::kRing);
  const int64_t one_shot_wrong = jaxring::RunAllReduces(Path::kOneShot);
  const int64_t push_wrong = jaxring::RunAllReduces(Path::kPush);
  std::printf("mutation %d: ring %lld wrong elements, one-shot %lld, push %lld\n",
              JAXRING_TSAN_MUTATION, static_cast<long long>(ring_wrong),
              static_cast<long long>(one_shot_wrong), static_cast<long long>(push_wrong));
  return ring_wrong == 0 && one_shot_wrong == 0 && push_wrong == 0 ? 0 : 1;
}
