#include "cuda/staged_meeting.h"

#include <algorithm>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "core/meeting.h"

namespace jaxring {

// The session of one meeting: each rank's state and progress, under a lock of
// its own, so that the op's meetings in flight do not wait on each other.
struct StagedSession : Meeting {
  explicit StagedSession(int64_t ranks)
      : Meeting(ranks), progress_changed(ranks), states(ranks), progress(ranks) {}
  std::mutex mu;  // what follows; taken after the place's lock where both are
  std::condition_variable arrival;
  // progress_changed[r] wakes the two neighbours that wait on rank r, not
  // every rank (a ring of 8 on 2 cores spends its time in wake-ups otherwise).
  std::vector<std::condition_variable> progress_changed;
  std::vector<void*> states;
  std::vector<int64_t> progress;
  int64_t arrived = 0;
};

// Every meeting of one op on one ring group, and the sessions they run on.
struct StagedPlace {
  StagedPlace(int64_t op_id, int64_t group, int64_t ranks) : meetings(op_id, group, ranks) {}
  Meetings<StagedSession> meetings;  // its lock guards what follows
  std::vector<std::unique_ptr<StagedSession>> sessions;  // at most the meetings ever open at once
  std::vector<StagedSession*> idle;
};

namespace {

StagedPlace* PlaceFor(const CallKey& key, int64_t ranks) {
  // Each handler thread finds its places without a lock after the first call.
  thread_local std::map<std::pair<int64_t, int64_t>, StagedPlace*> cache;
  const std::pair<int64_t, int64_t> op{key.op_id, key.group};
  if (auto hit = cache.find(op); hit != cache.end()) return hit->second;
  static std::mutex registry_mu;
  static auto* registry = new std::map<std::pair<int64_t, int64_t>, std::unique_ptr<StagedPlace>>();
  std::lock_guard<std::mutex> lock(registry_mu);
  auto& place = (*registry)[op];
  if (place == nullptr) place = std::make_unique<StagedPlace>(key.op_id, key.group, ranks);
  return cache[op] = place.get();
}

}  // namespace

StagedMeeting::StagedMeeting(const CallKey& key, int64_t ranks, int64_t rank) : rank_(rank) {
  StagedPlace* place = PlaceFor(key, ranks);
  Meetings<StagedSession>& meetings = place->meetings;
  if (meetings.ranks() != ranks) {
    error_ = "jaxring: devices of one collective disagree on the ring size (" + std::to_string(meetings.ranks()) +
             " vs " + std::to_string(ranks) + ")";
    return;
  }
  place_ = place;
  std::lock_guard<std::mutex> lock(meetings.mu());
  const MeetingKey meeting = meetings.NextCall(rank, key.run_id);
  session_ = meetings.Find(meeting);
  if (session_ != nullptr) return;
  if (place->idle.empty()) {
    place->sessions.push_back(std::make_unique<StagedSession>(ranks));
    place->idle.push_back(place->sessions.back().get());
  }
  session_ = place->idle.back();
  place->idle.pop_back();
  std::fill(session_->states.begin(), session_->states.end(), nullptr);
  std::fill(session_->progress.begin(), session_->progress.end(), 0);
  session_->arrived = 0;
  meetings.Open(meeting, session_);
}

StagedMeeting::~StagedMeeting() {
  if (session_ == nullptr || !place_->meetings.Leave(session_)) return;
  std::lock_guard<std::mutex> lock(place_->meetings.mu());
  place_->meetings.Close(session_);
  place_->idle.push_back(session_);
}

std::string StagedMeeting::Error() const {
  return session_->broken.load(std::memory_order_acquire) ? session_->broken_why : std::string();
}

void StagedMeeting::WakeEveryone() {
  // A waiter checks `broken` under the session's lock: taking it once orders
  // the wake-up after any check that saw it unset.
  { std::lock_guard<std::mutex> lock(session_->mu); }
  session_->arrival.notify_all();
  for (auto& changed : session_->progress_changed) changed.notify_all();
}

std::string StagedMeeting::Arrive(void* state, Clock::time_point deadline) {
  if (!error_.empty()) return error_;
  Meetings<StagedSession>& meetings = place_->meetings;
  const int64_t ranks = meetings.ranks();
  {
    std::lock_guard<std::mutex> lock(meetings.mu());
    std::string error;
    if (!meetings.Join(session_, rank_, &error)) return error;
    std::lock_guard<std::mutex> session_lock(session_->mu);
    session_->states[rank_] = state;
    ++session_->arrived;
  }
  session_->arrival.notify_all();
  std::unique_lock<std::mutex> lock(session_->mu);
  if (session_->arrival.wait_until(lock, deadline, [&] {
        return session_->arrived == ranks || session_->broken.load(std::memory_order_acquire);
      })) {
    return Error();
  }
  lock.unlock();
  {
    std::lock_guard<std::mutex> place_lock(meetings.mu());
    std::lock_guard<std::mutex> session_lock(session_->mu);
    if (session_->arrived == ranks) return Error();
    meetings.Break(session_, meetings.NeverArrived(*session_, rank_));
  }
  WakeEveryone();
  return Error();
}

std::string StagedMeeting::WaitFor(int64_t peer, int64_t count, Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(session_->mu);
  if (session_->progress_changed[peer].wait_until(lock, deadline, [&] {
        return session_->progress[peer] >= count || session_->broken.load(std::memory_order_acquire);
      })) {
    return Error();
  }
  const int64_t at = session_->progress[peer];
  lock.unlock();
  Fail(place_->meetings.Stopped(*session_, rank_, peer, count, at));
  return Error();
}

void StagedMeeting::Advance() {
  {
    std::lock_guard<std::mutex> lock(session_->mu);
    ++session_->progress[rank_];
  }
  session_->progress_changed[rank_].notify_all();
}

void StagedMeeting::Fail(const std::string& error) {
  {
    std::lock_guard<std::mutex> lock(place_->meetings.mu());
    place_->meetings.Break(session_, error);
  }
  WakeEveryone();
}

void* StagedMeeting::state(int64_t peer) const { return session_->states[peer]; }

}  // namespace jaxring
