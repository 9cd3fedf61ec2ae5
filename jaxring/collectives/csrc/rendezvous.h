// Host-side meeting point of the handlers of one collective launch.
//
// XLA runs one handler per device, each on its own host thread. Handlers of
// the same launch find each other by (RunId, op id, ring group): the RunId is
// shared by all devices of one execution and the op id is fixed at trace time,
// so several collectives in one program never mix. The rendezvous then
// carries each rank's progress through the ring schedule.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace jaxring {

using Clock = std::chrono::steady_clock;

struct RendezvousKey {
  int64_t run_id;
  int64_t op_id;
  int64_t group;
  // How many times this op already ran in this launch (inside a loop, or an
  // inlined function called twice): the k-th run on one device meets the
  // k-th run on the others.
  int64_t occurrence = 0;
  bool operator<(const RendezvousKey& o) const {
    if (run_id != o.run_id) return run_id < o.run_id;
    if (op_id != o.op_id) return op_id < o.op_id;
    if (group != o.group) return group < o.group;
    return occurrence < o.occurrence;
  }
};

// How many calls of one op a rank has made in each execution (RunId), so that
// its k-th call in an execution meets the k-th call of its peers there, however
// the executions in flight interleave. Bounded: the oldest runs are forgotten
// past kRemembered (XLA keeps far fewer executions in flight). Not
// thread-safe: its owner's lock guards it.
class Occurrences {
 public:
  int64_t Next(int64_t run_id) {
    auto [it, inserted] = counts_.try_emplace(run_id, 0);
    const int64_t occurrence = it->second++;
    if (inserted) {
      // Forget the run seen first, not the smallest id: XLA's run ids need not increase.
      order_.push_back(run_id);
      if (order_.size() > kRemembered) {
        counts_.erase(order_.front());
        order_.pop_front();
      }
    }
    return occurrence;
  }

 private:
  static constexpr size_t kRemembered = 1024;
  std::map<int64_t, int64_t> counts_;
  std::deque<int64_t> order_;  // the runs in counts_, oldest first
};

class Rendezvous {
 public:
  Rendezvous(RendezvousKey key, int64_t ranks);

  // Publishes this rank's state and waits for every rank, until `deadline`.
  // Returns an empty string on success, else the error (every waiting rank
  // gets it, naming the ranks that never arrived).
  std::string Arrive(int64_t rank, void* state, Clock::time_point deadline);

  // Waits until `rank`'s progress reaches `count`.
  std::string WaitFor(int64_t rank, int64_t count, Clock::time_point deadline);

  // Marks one more stage of `rank` done.
  void Advance(int64_t rank);

  // Fails the whole launch (a rank hit an error); wakes every waiter.
  void Fail(const std::string& error);

  // The launch's error, empty while none.
  std::string error();

  void* state(int64_t rank) const { return states_[rank]; }
  int64_t ranks() const { return static_cast<int64_t>(states_.size()); }

 private:
  std::string Describe() const;
  void WakeEveryone();  // with mu_ released

  const RendezvousKey key_;
  std::mutex mu_;
  std::condition_variable arrival_;
  // progress_changed_[r] wakes the two neighbours that wait on rank r, not
  // every rank (a ring of 8 on 2 cores spends its time in wake-ups otherwise).
  std::vector<std::condition_variable> progress_changed_;
  std::vector<void*> states_;
  std::vector<bool> arrived_;
  std::vector<int64_t> progress_;
  int64_t arrived_count_ = 0;
  std::string error_;
};

// Joins the rendezvous of `key` (creating it for the first rank) and leaves it
// when the returned handle is destroyed; the last rank to leave removes it. A
// key that failed stays failed, so a rank arriving after the timeout fails at
// once instead of waiting again.
class RendezvousHandle {
 public:
  // `key.occurrence` is filled in here from this rank's own count.
  RendezvousHandle(RendezvousKey key, int64_t ranks, int64_t rank);
  ~RendezvousHandle();
  RendezvousHandle(const RendezvousHandle&) = delete;
  RendezvousHandle& operator=(const RendezvousHandle&) = delete;
  Rendezvous* operator->() const { return rendezvous_.get(); }
  // Non-empty when this key already failed or `ranks` disagrees with the
  // ranks of the other participants.
  const std::string& join_error() const { return join_error_; }

 private:
  RendezvousKey key_;
  std::shared_ptr<Rendezvous> rendezvous_;
  std::string join_error_;
};

// Default timeout for every rendezvous, in seconds (infinity: no limit); set
// from Python, which owns its value (jaxring/collectives/timeout.py).
double DefaultTimeoutSeconds();
void SetDefaultTimeoutSeconds(double seconds);
// What "no limit" waits at most: about 31 years, within the clock's range.
inline constexpr double kForeverSeconds = 1e9;
// The deadline of a call with `timeout_ms`: > 0 that many milliseconds, 0 the
// default, < 0 none.
Clock::time_point DeadlineFor(int64_t timeout_ms);

}  // namespace jaxring
