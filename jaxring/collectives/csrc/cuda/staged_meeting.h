// The host-staged engine's meeting point of the handlers of one collective
// launch (staged_engine.cu): XLA runs one handler per device, each on its own
// host thread; the handlers of one call (core/call_key.h) meet here, and the
// rendezvous then carries each rank's progress through the ring schedule.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/call_key.h"
#include "core/timeout.h"

namespace jaxring {

class Rendezvous {
 public:
  Rendezvous(CallKey key, int64_t ranks);

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

  const CallKey key_;
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
  RendezvousHandle(CallKey key, int64_t ranks, int64_t rank);
  ~RendezvousHandle();
  RendezvousHandle(const RendezvousHandle&) = delete;
  RendezvousHandle& operator=(const RendezvousHandle&) = delete;
  Rendezvous* operator->() const { return rendezvous_.get(); }
  // Non-empty when this key already failed or `ranks` disagrees with the
  // ranks of the other participants.
  const std::string& join_error() const { return join_error_; }

 private:
  CallKey key_;
  std::shared_ptr<Rendezvous> rendezvous_;
  std::string join_error_;
};

}  // namespace jaxring
