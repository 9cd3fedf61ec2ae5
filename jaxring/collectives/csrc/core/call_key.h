// Which call a handler runs: the handlers of one launch find each other by
// (RunId, op id, ring group, occurrence). The RunId is shared by all devices
// of one execution and the op id is fixed at trace time, so several
// collectives in one program never mix.
#pragma once

#include <cstdint>
#include <deque>
#include <map>

namespace jaxring {

struct CallKey {
  int64_t run_id;
  int64_t op_id;
  int64_t group;
  // How many times this op already ran in this launch (inside a loop, or an
  // inlined function called twice): the k-th run on one device meets the
  // k-th run on the others.
  int64_t occurrence = 0;
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

}  // namespace jaxring
