#include "core/meeting.h"

#include <algorithm>

namespace jaxring {
namespace {

// What to do about a rank that never came or stopped.
constexpr char kAdvice[] =
    ". Every device of the axis must run the same collectives in the same order; if they do, the "
    "runtime did not run this execution on those devices in time: XLA's CPU client runs out of threads "
    "with many steps queued unless NPROC gives it enough, which importing jaxring before JAX's first use "
    "of a device does (docs/USAGE.md, \"Steps in flight\"). Raise the timeout with JAXRING_TIMEOUT_S or "
    "timeout= if a rank is legitimately slow. The op's other executions go on.";

}  // namespace

std::string CallName(const MeetingKey& key) {
  return "execution " + std::to_string(key.run_id) + " (call " + std::to_string(key.occurrence + 1) +
         " of this op there)";
}

MeetingPlace::MeetingPlace(int64_t op_id, int64_t group, int64_t ranks)
    : op_id_(op_id), group_(group), ranks_(ranks), occurrences_(ranks), latest_call_(ranks) {}

MeetingKey MeetingPlace::NextCall(int64_t rank, int64_t run_id) {
  const MeetingKey key{run_id, occurrences_[rank].Next(run_id)};
  latest_call_[rank] = key;
  return key;
}

void MeetingPlace::Reset(Meeting* meeting, const MeetingKey& key) {
  meeting->key = key;
  meeting->open = true;
  std::fill(meeting->joined.begin(), meeting->joined.end(), false);
  meeting->left.store(0, std::memory_order_relaxed);
  meeting->broken.store(false, std::memory_order_relaxed);
  meeting->broken_why.clear();
}

bool MeetingPlace::Join(Meeting* meeting, int64_t rank, std::string* error) {
  meeting->joined[rank] = true;
  if (!meeting->broken.load(std::memory_order_relaxed)) return true;
  *error = meeting->broken_why;
  return false;
}

std::string MeetingPlace::Break(Meeting* meeting, const std::string& why) {
  if (!meeting->broken.load(std::memory_order_relaxed)) {
    meeting->broken_why = why;
    meeting->broken.store(true, std::memory_order_release);
  }
  return meeting->broken_why;
}

std::string MeetingPlace::Name(const Meeting& meeting) const {
  return "jaxring collective: op " + std::to_string(op_id_) + " in " + CallName(meeting.key);
}

std::string MeetingPlace::NeverArrived(const Meeting& meeting, int64_t rank) const {
  std::string missing, latest;
  for (int64_t p = 0; p < ranks_; ++p) {
    if (meeting.joined[p]) continue;
    missing += (missing.empty() ? "" : ", ") + std::to_string(p);
    latest += std::string(latest.empty() ? " (" : "; ") + "rank " + std::to_string(p) +
              (latest_call_[p] ? "'s latest call of this op was in " + CallName(*latest_call_[p])
                               : std::string(" never called this op"));
  }
  if (missing.empty()) return "";
  return Name(meeting) + ": rank " + std::to_string(rank) + " of " + std::to_string(ranks_) + " (ring group " +
         std::to_string(group_) + ") timed out waiting for rank(s) [" + missing + "] that never arrived" + latest +
         ")" + kAdvice;
}

std::string MeetingPlace::Stopped(const Meeting& meeting, int64_t rank, int64_t peer, int64_t stage,
                                  int64_t at) const {
  return Name(meeting) + ": rank " + std::to_string(rank) + " of " + std::to_string(ranks_) + " (ring group " +
         std::to_string(group_) + ") timed out waiting for rank " + std::to_string(peer) + " to reach stage " +
         std::to_string(stage) + " (it is at " + std::to_string(at) + ")" + kAdvice;
}

}  // namespace jaxring
