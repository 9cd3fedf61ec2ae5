// The meeting of the handlers of one call, written once for every engine
// (cpu/cpu_engine.cc, cuda/device_engine.cc, cuda/staged_meeting.cc).
//
// XLA runs one handler per device, each on its own host thread. The calls of
// one op on one ring of devices in one execution (XLA's RunId, as XLA's own
// collectives meet) and of the same occurrence there (a rank's k-th call of
// the op in that execution, for ops in loops) form a meeting, whatever else
// is in flight: JAX queues executions without waiting for them, so a rank may
// be in several at once and the ranks may start them in any order.
//
// A meeting some rank never comes to breaks at the timeout on the ranks there,
// naming the ranks that never arrived and each one's latest call of the op. It
// stays open, broken, until every rank has come and left, so a rank that comes
// late fails at once without touching its peers' buffers (XLA may have freed
// them), and the op's other meetings go on.
//
// Each engine keeps its own session policy (what a meeting runs on, how its
// ranks wait, when a session may serve another meeting) in a session type
// derived from Meeting.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/call_key.h"

namespace jaxring {

// Which meeting a call comes to: its execution, and its occurrence there.
struct MeetingKey {
  int64_t run_id;
  int64_t occurrence;
  bool operator==(const MeetingKey& o) const { return run_id == o.run_id && occurrence == o.occurrence; }
};

// "execution E (call C of this op there)", as every error names a call.
std::string CallName(const MeetingKey& key);

// What every engine's session holds of the meeting it serves. Guarded by its
// place's mu(), except `left` and `broken`, which the ranks read without it.
struct Meeting {
  explicit Meeting(int64_t ranks) : joined(ranks, false) {}
  MeetingKey key{};
  bool open = false;                // some rank came and not every rank has left
  std::vector<bool> joined;         // the ranks that came
  std::atomic<int64_t> left{0};     // the ranks done with it
  std::atomic<bool> broken{false};  // it failed: every rank there and every later one fails
  std::string broken_why;           // written before `broken` is set
};

// Every meeting of one op on one ring of devices.
class MeetingPlace {
 public:
  MeetingPlace(int64_t op_id, int64_t group, int64_t ranks);
  int64_t ranks() const { return ranks_; }
  // Guards the meetings' plain fields, and whatever its engine's policy adds.
  std::mutex& mu() { return mu_; }

  // Under mu(): the meeting of `rank`'s next call in execution `run_id`,
  // which is remembered as its latest call.
  MeetingKey NextCall(int64_t rank, int64_t run_id);
  // Under mu(): `rank` comes to `meeting`; false, with the meeting's error,
  // where it already broke: the rank must then leave without touching its
  // peers' buffers.
  bool Join(Meeting* meeting, int64_t rank, std::string* error);
  // Counts a rank out of `meeting`: true for the last one, which must then
  // close it (under mu()).
  bool Leave(Meeting* meeting) const {
    return meeting->left.fetch_add(1, std::memory_order_acq_rel) + 1 == ranks_;
  }
  // Under mu(): fails `meeting` with `why` unless it already failed; returns
  // the meeting's error.
  std::string Break(Meeting* meeting, const std::string& why);

  // The errors of a meeting, one wording for every engine. Under mu(): `rank`
  // gave up waiting for the ranks that never came ("" when every rank came).
  std::string NeverArrived(const Meeting& meeting, int64_t rank) const;
  // `rank` gave up waiting for `peer`, which came, to reach `stage`.
  std::string Stopped(const Meeting& meeting, int64_t rank, int64_t peer, int64_t stage, int64_t at) const;
  // The meeting's name, which starts every error about it.
  std::string Name(const Meeting& meeting) const;

 protected:
  void Reset(Meeting* meeting, const MeetingKey& key);

 private:
  const int64_t op_id_, group_, ranks_;
  std::mutex mu_;
  std::vector<Occurrences> occurrences_;                 // by rank
  std::vector<std::optional<MeetingKey>> latest_call_;  // by rank
};

// The open meetings of a place, each on its engine's session.
template <typename Session>
class Meetings : public MeetingPlace {
 public:
  using MeetingPlace::MeetingPlace;

  // Under mu(): the session of the open meeting `key`, or nullptr. A scan: few
  // meetings are open at once (the executions in flight, and broken meetings
  // some rank never came to).
  Session* Find(const MeetingKey& key) const {
    for (Session* session : open_) {
      if (session->key == key) return session;
    }
    return nullptr;
  }
  // Under mu(): opens `key`'s meeting on `session`, which no open meeting holds.
  void Open(const MeetingKey& key, Session* session) {
    Reset(session, key);
    open_.push_back(session);
  }
  // Under mu(): closes a meeting every rank has left.
  void Close(Session* session) {
    session->open = false;
    for (Session*& held : open_) {
      if (held != session) continue;
      held = open_.back();
      open_.pop_back();
      return;
    }
  }

 private:
  std::vector<Session*> open_;
};

}  // namespace jaxring
