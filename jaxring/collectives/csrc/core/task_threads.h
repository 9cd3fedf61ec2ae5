// Threads for handlers that wait on their peers: every task gets a thread at
// once (an idle one, else a new one), so no task waits for another to finish.
// A handler that waits must not hold one of XLA's worker threads: XLA may run
// several independent collectives of a program at once, in different orders
// in different processes, and tasks blocking XLA's few threads (2 cores here)
// would wait on each other.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace jaxring {

class TaskThreads {
 public:
  void Run(std::function<void()> task) {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
    if (static_cast<int64_t>(tasks_.size()) > idle_) {
      std::thread([this] { Serve(); }).detach();
    } else {
      wake_.notify_one();
    }
  }

 private:
  void Serve() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      ++idle_;
      wake_.wait(lock, [&] { return !tasks_.empty(); });
      --idle_;
      auto task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> tasks_;
  int64_t idle_ = 0;
};

// Runs `work` on a task thread and completes `promise` with its outcome: ""
// makes the future available, anything else fails it with that message. The
// asynchronous handlers return the promise's future at once, so XLA's thread
// is free meanwhile. One pool per handler module, never destroyed: its
// threads outlive main.
inline void CompleteOnTaskThread(xla::ffi::Promise promise, std::function<std::string()> work) {
  static auto* threads = new TaskThreads();
  threads->Run([promise, work = std::move(work)]() mutable {
    const std::string error = work();
    if (error.empty()) {
      promise.SetAvailable();
    } else {
      promise.SetError(xla::ffi::Error::Internal(error));
    }
  });
}

}  // namespace jaxring
