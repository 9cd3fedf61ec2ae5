// What the device engine's CPU checks share (module_engine_test.cc for
// pytest, engine_tsan.cc under ThreadSanitizer): a fake CUDA that records
// every call and can play each launch's kernel on a host thread, and a
// runtime that starts executions in given orders. Header-only, free of
// Python.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/host_elementwise.h"
#include "core/ring_protocol.h"
#include "core/timeout.h"
#include "cuda/device_engine.h"
#include "testing/execution_orders.h"

namespace jaxring {

// ring_protocol.h's primitives over the engine's flag words, on host threads.
struct PlayedSync {
  using Word = uint64_t;
  Clock::time_point deadline;
  void Publish(Word* const* words, int count, uint64_t value) {
    for (int i = 0; i < count; ++i) __atomic_store_n(words[i], value, __ATOMIC_RELEASE);
  }
  bool Wait(const Word* word, uint64_t value, uint64_t* seen) {
    for (int spins = 0;; ++spins) {
      *seen = __atomic_load_n(word, __ATOMIC_ACQUIRE);
      if (*seen >= value) return true;
      if ((spins & 63) == 0 && Clock::now() > deadline) return false;
      std::this_thread::yield();
    }
  }
  bool WaitEvery(const Word* first, int64_t stride, int count, uint64_t value, int64_t* which,
                 uint64_t* seen) {
    return WaitInTurn(*this, first, stride, count, value, which, seen);
  }
};

// The lanes of the kernel of the call's reduction (float32 data) one after
// another (lane b of a rank waits only on lane b of its peers, so every rank
// going through the lanes in order is one schedule the GPU may run), then its
// last block's work (FinishCall in cuda/device_ring.cu).
template <Reduction R>
void PlayKernelOf(KernelArgs args) {
  PlayedSync sync{Clock::now() + std::chrono::nanoseconds(args.timeout_ns)};
  HostElementwise<R> ew;
  bool failed = false;
  for (int64_t lane = 0; lane < args.lanes; ++lane) {
    const LaneCall<uint64_t> call{args.plan.ranks(), args.plan.rank, args.lanes, lane, args.epoch,
                                  args.flag_blocks, args.buffers};
    const LaneOutcome outcome = args.one_shot
                                    ? RunShotLane<float>(Shot::kOneShot, args.plan, call, sync, ew)
                                    : RunRingLane<float, float>(args.plan, call, sync, ew);
    if (!outcome.ok) {
      args.failures[lane] = LaneFailureRecord{args.call_tag, outcome.peer, outcome.wanted, outcome.seen};
      failed = true;
    }
  }
  if (failed) {
    const SchedulePlan& plan = args.plan;
    const int64_t n = plan.OutputElements();
    float* out = static_cast<float*>(args.buffers[plan.rank].out);
    for (int64_t i = 0; i < n; ++i) out[i] = std::nanf("");
  }
  __atomic_fetch_add(args.blocks_done, static_cast<uint64_t>(args.lanes), __ATOMIC_ACQ_REL);
  __atomic_store_n(args.finished, args.epoch, __ATOMIC_RELEASE);
}

inline void PlayKernel(const KernelArgs& args) {
  switch (args.reduction) {
    case Reduction::kSum:
      return PlayKernelOf<Reduction::kSum>(args);
    case Reduction::kMax:
      return PlayKernelOf<Reduction::kMax>(args);
    case Reduction::kMin:
      return PlayKernelOf<Reduction::kMin>(args);
  }
}

struct Launched {
  int64_t rank;
  uint64_t epoch;
  int64_t lanes;
  bool one_shot;
  std::vector<uintptr_t> flag_blocks;
  std::vector<uintptr_t> inputs;
  uint64_t blocks_done_after;
  uintptr_t blocks_done;
};

class FakeCuda : public CudaSeam {
 public:
  FakeCuda(int devices, std::map<std::pair<int, int>, PeerLink> links)
      : devices_(devices), links_(std::move(links)) {}

  int DeviceCount() override {
    Record("device_count");
    return devices_;
  }
  std::string LoadKernels(int device) override {
    Record("load_kernels " + std::to_string(device));
    return fail_setup_ == "load_kernels" ? "fake: no kernel image for this device" : "";
  }
  std::string AllocZeroedDevice(int device, size_t bytes, void** ptr) override {
    Record("alloc_device " + std::to_string(device) + " " + std::to_string(bytes));
    memory_.emplace_back(bytes / sizeof(uint64_t) + 1, 0);
    *ptr = memory_.back().data();
    return "";
  }
  std::string AllocMappedHost(size_t bytes, void** host, void** device_view) override {
    Record("alloc_mapped " + std::to_string(bytes));
    memory_.emplace_back(bytes / sizeof(uint64_t) + 1, 0);
    *host = *device_view = memory_.back().data();
    return "";
  }
  PeerLink Link(int device, int peer) override {
    auto it = links_.find({device, peer});
    return it == links_.end() ? PeerLink::kNvlink : it->second;
  }
  std::string EnablePeerAccess(int device, int peer) override {
    Record("enable_peer " + std::to_string(device) + " " + std::to_string(peer));
    return "";
  }
  std::string PeerCanRead(const void* ptr, int peer) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++pointer_queries_;
    return unreadable_.count({reinterpret_cast<uintptr_t>(ptr), peer}) ? "fake: not mapped" : "";
  }
  // Plays the kernel: a lane of a rank told to fail records its failure as
  // the real kernel does (ring_protocol.h's outcome, at the call's epoch).
  std::string Launch(xla::ffi::DataType, const KernelArgs& args, void*) override {
    const int64_t rank = args.plan.rank, ranks = args.plan.ranks();
    if (play_) {
      std::lock_guard<std::mutex> lock(mu_);
      kernels_.emplace_back([args] { PlayKernel(args); });
      return "";
    }
    // Without `play` a kernel ends at once.
    __atomic_store_n(args.finished, args.epoch, __ATOMIC_RELEASE);
    // Timed calls (time_calls) take no lock here: the engine's path is timed.
    if (!keep_launches_ && !any_fail_.load(std::memory_order_acquire)) return "";
    std::lock_guard<std::mutex> lock(mu_);
    if (fail_.count({rank, args.epoch})) {
      const int64_t peer = fail_[{rank, args.epoch}];
      args.failures[0] = LaneFailureRecord{args.call_tag, peer, FlagValue(args.epoch, 1), FlagValue(args.epoch - 1, 3)};
    }
    if (!keep_launches_) return "";
    Launched l{rank, args.epoch, args.lanes, args.one_shot, {}, {}, args.blocks_done_after,
               reinterpret_cast<uintptr_t>(args.blocks_done)};
    for (int64_t p = 0; p < ranks; ++p) {
      l.flag_blocks.push_back(reinterpret_cast<uintptr_t>(args.flag_blocks[p]));
      l.inputs.push_back(reinterpret_cast<uintptr_t>(args.buffers[p].in));
    }
    launched_.push_back(l);
    return "";
  }

  // Joins every played kernel launched so far.
  void Drain() {
    std::vector<std::thread> kernels;
    {
      std::lock_guard<std::mutex> lock(mu_);
      kernels.swap(kernels_);
    }
    for (auto& k : kernels) k.join();
  }
  ~FakeCuda() override { Drain(); }

  void Record(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back(what + (launched_.empty() ? "" : " (after a launch)"));
  }

  int devices_;
  std::map<std::pair<int, int>, PeerLink> links_;
  std::mutex mu_;
  std::vector<std::string> calls_;
  std::vector<Launched> launched_;
  std::vector<std::vector<uint64_t>> memory_;
  std::set<std::pair<uintptr_t, int>> unreadable_;
  std::map<std::pair<int64_t, uint64_t>, int64_t> fail_;  // (rank, epoch) -> peer it waited for
  std::atomic<bool> any_fail_{false};  // fail_ is not empty
  int64_t pointer_queries_ = 0;
  bool keep_launches_ = true;
  bool play_ = false;
  std::vector<std::thread> kernels_;
  std::string fail_setup_;

};

}  // namespace jaxring
