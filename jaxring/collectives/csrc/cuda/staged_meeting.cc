#include "cuda/staged_meeting.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <tuple>

namespace jaxring {
namespace {

struct KeyLess {
  bool operator()(const CallKey& a, const CallKey& b) const {
    return std::tie(a.run_id, a.op_id, a.group, a.occurrence) < std::tie(b.run_id, b.op_id, b.group, b.occurrence);
  }
};

std::mutex registry_mu;
std::map<CallKey, std::weak_ptr<Rendezvous>, KeyLess>& Registry() {
  static auto* registry = new std::map<CallKey, std::weak_ptr<Rendezvous>, KeyLess>();
  return *registry;
}
// Keys whose launch failed, with the error; bounded so a long run that keeps
// failing cannot grow it without limit.
std::map<CallKey, std::string, KeyLess>& Failed() {
  static auto* failed = new std::map<CallKey, std::string, KeyLess>();
  return *failed;
}
constexpr size_t kMaxRememberedFailures = 1024;

// Per (op, group, rank): its calls in each launch.
std::map<std::tuple<int64_t, int64_t, int64_t>, Occurrences>& OccurrencesByRank() {
  static auto* occurrences = new std::map<std::tuple<int64_t, int64_t, int64_t>, Occurrences>();
  return *occurrences;
}

}  // namespace

Rendezvous::Rendezvous(CallKey key, int64_t ranks)
    : key_(key),
      progress_changed_(ranks),
      states_(ranks, nullptr),
      arrived_(ranks, false),
      progress_(ranks, 0) {}

void Rendezvous::WakeEveryone() {
  arrival_.notify_all();
  for (auto& cv : progress_changed_) cv.notify_all();
}

std::string Rendezvous::Describe() const {
  std::ostringstream out;
  out << "jaxring collective (op id " << key_.op_id << ", ring group "
      << key_.group << ", " << states_.size() << " ranks)";
  return out.str();
}

std::string Rendezvous::Arrive(int64_t rank, void* state,
                               Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!error_.empty()) return error_;
  if (arrived_[rank]) {
    return Describe() + ": rank " + std::to_string(rank) +
           " arrived twice; two devices claim the same ring position";
  }
  states_[rank] = state;
  arrived_[rank] = true;
  ++arrived_count_;
  arrival_.notify_all();
  const int64_t ranks = static_cast<int64_t>(states_.size());
  if (!arrival_.wait_until(lock, deadline, [&] {
        return arrived_count_ == ranks || !error_.empty();
      })) {
    std::ostringstream missing;
    const char* sep = "";
    for (int64_t r = 0; r < ranks; ++r) {
      if (!arrived_[r]) {
        missing << sep << r;
        sep = ", ";
      }
    }
    error_ = Describe() + ": timed out waiting for rank(s) [" + missing.str() +
             "] that never arrived. Every device of the axis must run the same "
             "collectives in the same order; raise the timeout with "
             "JAXRING_TIMEOUT_S or timeout= if a rank is legitimately slow.";
    lock.unlock();
    WakeEveryone();
    lock.lock();
  }
  return error_;
}

std::string Rendezvous::WaitFor(int64_t rank, int64_t count,
                                Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!progress_changed_[rank].wait_until(lock, deadline, [&] {
        return progress_[rank] >= count || !error_.empty();
      })) {
    error_ = Describe() + ": timed out waiting for rank " +
             std::to_string(rank) + " to reach stage " + std::to_string(count) +
             " (it is at " + std::to_string(progress_[rank]) + ")";
    lock.unlock();
    WakeEveryone();
    lock.lock();
  }
  return error_;
}

void Rendezvous::Advance(int64_t rank) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++progress_[rank];
  }
  progress_changed_[rank].notify_all();
}

std::string Rendezvous::error() {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void Rendezvous::Fail(const std::string& error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.empty()) error_ = error;
  }
  WakeEveryone();
}

RendezvousHandle::RendezvousHandle(CallKey key, int64_t ranks,
                                   int64_t rank)
    : key_(key) {
  std::lock_guard<std::mutex> lock(registry_mu);
  key_.occurrence = OccurrencesByRank()[{key.op_id, key.group, rank}].Next(key.run_id);
  key = key_;
  auto failed = Failed().find(key);
  if (failed != Failed().end()) join_error_ = failed->second;
  auto& slot = Registry()[key];
  rendezvous_ = slot.lock();
  if (!rendezvous_) {
    rendezvous_ = std::make_shared<Rendezvous>(key, ranks);
    slot = rendezvous_;
  } else if (rendezvous_->ranks() != ranks) {
    join_error_ = "jaxring: devices of one collective disagree on the ring size (" +
                  std::to_string(rendezvous_->ranks()) + " vs " +
                  std::to_string(ranks) + ")";
  }
  if (!join_error_.empty()) rendezvous_->Fail(join_error_);
}

RendezvousHandle::~RendezvousHandle() {
  std::lock_guard<std::mutex> lock(registry_mu);
  const std::string error = rendezvous_->error();
  if (!error.empty()) {
    if (Failed().size() >= kMaxRememberedFailures) Failed().erase(Failed().begin());
    Failed().emplace(key_, error);
  }
  auto it = Registry().find(key_);
  if (rendezvous_.use_count() == 1 && it != Registry().end()) Registry().erase(it);
  rendezvous_.reset();
}

}  // namespace jaxring
