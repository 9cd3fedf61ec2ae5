// A reusable barrier of host threads: __syncthreads() of a block, or the
// meeting of a rank's lanes between calls, where the protocol's host-thread
// tests (protocol_test_hook.cc, protocol_tsan.cc) stand in for a GPU.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace jaxring {

class HostBarrier {
 public:
  explicit HostBarrier(int64_t threads) : threads_(threads) {}
  void Arrive() {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t generation = generation_;
    if (++arrived_ == threads_) {
      arrived_ = 0;
      ++generation_;
      changed_.notify_all();
      return;
    }
    changed_.wait(lock, [&] { return generation_ != generation; });
  }

 private:
  const int64_t threads_;
  std::mutex mu_;
  std::condition_variable changed_;
  int64_t arrived_ = 0;
  int64_t generation_ = 0;
};

}  // namespace jaxring
