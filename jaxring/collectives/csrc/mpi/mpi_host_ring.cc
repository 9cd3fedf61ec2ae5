// The cross-process leg of jaxring.allreduce(..., processes=...) over host
// buffers, shared by the CPU and CUDA handlers (mpi_host_ring.h): an
// all-reduce (sum, max or min) of this device's chunk over the MPI processes
// of the communicator that jaxring/collectives/mpi.py registered for this
// device and the communicator the op was given.
// Three algorithms, chosen by the lowering (the same in every process):
//
// - one-shot (small buffers, where the price is latency): every process
//   sends its whole buffer to every other at once and sums all of them in
//   rank order (rank 0's + rank 1's + ...), so every process rounds the same
//   terms in the same order and ends with the same bits;
// - recursive doubling (small buffers over 4, 8, ... processes: class Doubling);
//   both move their buffers in pieces small enough for the MPI to send
//   eagerly (kEagerPieceBytes), and so end without the ring's farewells;
// - the ring: ring_schedule.h's all-reduce with one process per rank, each
//   step's chunk cut into slices (pieces) of at most `piece_elements`. A stage
//   (step t, slice k) receives from the left neighbour what this rank's stage
//   reads and sends to the right what the right's stage reads (the same
//   schedule evaluated for the right's rank). Sends and receives are posted
//   ahead: slice k of step t + 1 leaves for the right as soon as slice k of
//   step t is summed, while the later slices of step t are still arriving,
//   so the link stays busy while this process adds. Each chunk is summed
//   once, by one process, in one order: every process ends with the same bits.
//
// A leg may also run one phase of the ring alone (LegPlan::mode: ShardedUpdate's
// reduce-scatter and all-gather across processes, jaxring/collectives/sharded_update.py).
// Its buffers still hold all N chunks: a reduction stage writes where it reads
// (as the all-reduce's do), so the reduce-scatter leaves this rank's chunk at
// its own offset; the all-gather's seed stage takes this rank's chunk from the
// input at that offset, with no message.
//
// Buffers have the accumulation type (any lax type; Python casts 16-bit
// floats to float32), or a 16-bit float where allreduce's wire_dtype asks
// for half the bytes (jaxring/collectives/mpi.py): then each hop adds in
// float32 and rounds the partial result to 16 bits as it crosses (one-shot
// rounds once). Partial results live in the output. Each reduction combines as the ring's engines do (core/reduction.h,
// host_elementwise.h's Combine): complex numbers summed as pairs of reals,
// integers wrapping, max/min by lax's CPU rule. One-shot combines in rank
// order, so its bits are lax's (Doubling pairwise: within rounding of them); the ring starts each chunk at another rank,
// so of -0.0 and +0.0 either may win.
//
// Every wait polls MPI_Test against the deadline. The communicators return
// MPI's errors instead of aborting: a process (or node) that dies mid-call is
// then named at once where the MPI reports failures (Open MPI launched with
// `mpirun --with-ft ulfm`), instead of after the timeout or by a bare abort.
// Messages carry the op's tag, fixed when it is lowered, so collectives that
// XLA runs concurrently, or in different orders in different processes,
// never take each other's messages; within one op, messages between two
// processes are posted in stage order on both sides, and MPI matches them in
// that order.
#include <mpi.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // MPIX_Comm_get_failed, where the MPI has it (Open MPI, MPICH)
#endif

#include "core/host_elementwise.h"
#include "core/ring_handler_common.h"
#include "core/ring_schedule.h"
#include "mpi/mpi_host_ring.h"
#include "mpi/mpi_ring.h"

namespace jaxring {
namespace {

namespace ffi = xla::ffi;

// Poll MPI alone for spin_ns (SetLegSpinUs), then yielding the core between
// polls until kSpin, then every millisecond: a long wait means a late process,
// and must not eat a core another process needs.
constexpr auto kSpin = std::chrono::milliseconds(100);
std::atomic<int64_t> spin_ns{kDefaultLegSpinUs * 1000};

constexpr const char* kJobMustEnd =
    "The processes are now out of step: the job must end (scripts/train.py aborts it on an "
    "uncaught exception, as python -m mpi4py does); a training job continues from its newest "
    "checkpoint with --resume once every node is back.";

// "rank W of MPI.COMM_WORLD; " where `rank` of `comm` (a sub-communicator's) is another rank
// there, else "": the launcher and the other messages name processes by their world rank.
std::string WorldRank(MPI_Comm comm, int rank) {
  MPI_Group group, world;
  MPI_Comm_group(comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  int in_world = MPI_UNDEFINED;
  MPI_Group_translate_ranks(group, 1, &rank, world, &in_world);
  MPI_Group_free(&world);
  MPI_Group_free(&group);
  return in_world == rank || in_world == MPI_UNDEFINED ? "" : "rank " + std::to_string(in_world) + " of MPI.COMM_WORLD; ";
}

std::string NoAnswer(const Leg& leg, int peer, const char* waiting_for) {
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%g", TimeoutSecondsFor(leg.plan->timeout_ms));
  return "jaxring.allreduce across processes (" + std::string(leg.plan->what) + " on device " +
         std::to_string(leg.device) + ", tag " + std::to_string(leg.plan->tag) + "): rank " +
         std::to_string(leg.rank) + " of " + std::to_string(leg.size) + " waited " + seconds +
         " s " + waiting_for + "; no answer from rank " + std::to_string(peer) + " (" + WorldRank(leg.comm, peer) +
         "stopped, dead, or in another call). The limit is set by timeout=, "
         "jaxring.set_default_timeout or $JAXRING_TIMEOUT_S. " + kJobMustEnd;
}

// The processes `comm` knows to have failed, as "rank 2, rank 3", or "" where
// the MPI cannot say.
std::string FailedRanks(MPI_Comm comm) {
  std::string names;
#if defined(MPIX_ERR_PROC_FAILED)
  MPI_Group failed, all;
  if (MPIX_Comm_get_failed(comm, &failed) != MPI_SUCCESS) return names;
  int count = 0;
  MPI_Group_size(failed, &count);
  std::vector<int> in_failed(count), in_comm(count);
  for (int i = 0; i < count; ++i) in_failed[i] = i;
  MPI_Comm_group(comm, &all);
  MPI_Group_translate_ranks(failed, count, in_failed.data(), all, in_comm.data());
  for (int rank : in_comm) names += (names.empty() ? "rank " : ", rank ") + std::to_string(rank);
  MPI_Group_free(&all);
  MPI_Group_free(&failed);
#endif
  return names;
}

// The message for MPI error `rc`, met while waiting for `peer` (-1: one of several).
std::string Failed(const Leg& leg, int rc, int peer, const char* waiting_for) {
  char reported[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, reported, &length);
  const std::string failed = FailedRanks(leg.comm);
  const std::string waited = peer >= 0 ? "rank " + std::to_string(peer) : "the other processes";
  return "jaxring.allreduce across processes (" + std::string(leg.plan->what) + " on device " +
         std::to_string(leg.device) + ", tag " + std::to_string(leg.plan->tag) + "): rank " +
         std::to_string(leg.rank) + " of " + std::to_string(leg.size) + ", waiting " +
         waiting_for + " from " + waited + ", got MPI's error \"" +
         std::string(reported, length) + "\"" +
         (failed.empty() ? "" : "; failed: " + failed + " (the process, or its node, is gone)") +
         ". " + kJobMustEnd;
}

// Polls until `done()` or `until`; false at `until`.
template <typename Done>
bool PollUntil(Clock::time_point until, Done done) {
  const auto start = Clock::now();
  const auto spin = std::chrono::nanoseconds(spin_ns.load(std::memory_order_relaxed));
  for (;;) {
    if (done()) return true;
    const auto now = Clock::now();
    if (now > until) return false;
    if (now - start < spin) continue;
    if (now - start < kSpin) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}

bool Completed(MPI_Request* request) {
  int done = 0;
  MPI_Test(request, &done, MPI_STATUS_IGNORE);
  return done != 0;
}

// MPI_Test(request): true once it completed or failed, *rc saying which.
bool Tested(MPI_Request* request, int* rc) {
  int done = 0;
  *rc = MPI_Test(request, &done, MPI_STATUS_IGNORE);
  return done != 0 || *rc != MPI_SUCCESS;
}

// MPI_Testall over `requests`: true once all completed or one failed, *rc saying which.
bool AllTested(std::vector<MPI_Request>& requests, int* rc) {
  int done = 0;
  *rc = MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done,
                    MPI_STATUSES_IGNORE);
  return done != 0 || *rc != MPI_SUCCESS;
}

// Past the deadline: cancels the receives still pending (no message will
// come: MPI_Finalize must not wait for them) and returns the message naming
// `peers[i]` for the first pending receive, else for the first pending send.
std::string TimedOut(std::vector<MPI_Request>& receives, const std::vector<int>& receive_peers,
                     std::vector<MPI_Request>& sends, const std::vector<int>& send_peers,
                     const Leg& leg) {
  int silent = -1;
  for (size_t i = 0; i < receives.size(); ++i) {
    if (receives[i] != MPI_REQUEST_NULL && !Completed(&receives[i])) {
      if (silent < 0) silent = receive_peers[i];
      MPI_Cancel(&receives[i]);
    }
  }
  if (silent >= 0) return NoAnswer(leg, silent, "for a chunk");
  for (size_t i = 0; i < sends.size(); ++i) {
    if (sends[i] != MPI_REQUEST_NULL && !Completed(&sends[i])) {
      return NoAnswer(leg, send_peers[i], "for a chunk to be taken");
    }
  }
  return NoAnswer(leg, receive_peers.empty() ? -1 : receive_peers[0], "for a chunk");
}

// Every wait of a leg, as LegInFlight::Finish waits: polls `done` (which sets
// *rc) for at most `patience`, never past the leg's deadline. False when out
// of patience; else true with *error "" once done, `timed_out()` past the
// deadline, or `failed()` where MPI reported an error in *rc.
template <typename Done, typename TimedOutMessage, typename FailedMessage>
bool Await(Clock::duration patience, const Leg& leg, const int* rc, Done done, TimedOutMessage timed_out,
           FailedMessage failed, std::string* error) {
  // Done at the first test (an eager send, a message already in) reads no
  // clock: the path that most waits of a small leg take.
  if (!done()) {
    const auto now = Clock::now();
    const auto until = leg.deadline - now < patience ? leg.deadline : now + patience;
    if (!PollUntil(until, done)) {
      if (until < leg.deadline) return false;
      *error = timed_out();
      return true;
    }
  }
  *error = *rc != MPI_SUCCESS ? failed() : "";
  return true;
}

// The ring's last messages: an empty one to every process it sent to, once its
// own sends completed, and one from every process it received from. Its
// messages are larger than the MPI sends eagerly, and such a
// receive may complete before the send it matched does (the sender may
// still wait for an answer that only the receiver's next MPI call delivers),
// so a process that finished its leg and then left MPI (for JAX's gloo psum,
// say) could hold its left neighbour's leg until it came back: 4 processes
// hung so, one in a gloo psum, one in the leg (docs/PERFORMANCE.md). Waiting
// for these keeps every process calling MPI until every send to it completed.
class Farewells {
 public:
  void Post(std::vector<int> to, std::vector<int> from, const Leg& leg) {
    to_ = std::move(to);
    from_ = std::move(from);
    receives_.assign(from_.size(), MPI_REQUEST_NULL);
    sends_.assign(to_.size(), MPI_REQUEST_NULL);
    for (size_t i = 0; i < from_.size(); ++i) {
      MPI_Irecv(&nothing_, 0, MPI_BYTE, from_[i], leg.plan->tag, leg.comm, &receives_[i]);
    }
    for (size_t i = 0; i < to_.size(); ++i) {
      MPI_Isend(&nothing_, 0, MPI_BYTE, to_[i], leg.plan->tag, leg.comm, &sends_[i]);
    }
    posted_ = true;
  }
  bool posted() const { return posted_; }
  // As LegInFlight::Finish.
  bool Finish(Clock::duration patience, const Leg& leg, std::string* error) {
    int rc = MPI_SUCCESS;
    return Await(
        patience, leg, &rc,
        [&] { return AllTested(receives_, &rc) && (rc != MPI_SUCCESS || AllTested(sends_, &rc)); },
        [&] { return TimedOut(receives_, from_, sends_, to_, leg); },
        [&] { return Failed(leg, rc, -1, "for the end of the exchange"); }, error);
  }

 private:
  std::vector<int> to_, from_;
  std::vector<MPI_Request> receives_, sends_;
  char nothing_ = 0;
  bool posted_ = false;
};

// Buffers for the other processes' messages, kept from call to call: their
// pages are mapped already, where a fresh allocation has its pages faulted
// in under the transfer. A leg takes one for as long as it is in flight (it
// may move to another thread meanwhile). The request lists of one-shot and
// recursive doubling are kept with them (emptied, their capacity kept): four
// allocations fewer per small leg, whose whole cost is a few microseconds.
class Scratch {
 public:
  struct Requests {
    std::vector<MPI_Request> receives, sends;
    std::vector<int> receive_peers, send_peers;
    void Clear() {
      receives.clear();
      sends.clear();
      receive_peers.clear();
      send_peers.clear();
    }
  };

  explicit Scratch(size_t bytes) : held_(Take()) {
    if (held_->bytes.size() < bytes) held_->bytes.resize(bytes);
    held_->requests.Clear();
  }
  // Given back only by a leg that finished cleanly: after a failure a message
  // may still land in it.
  void GiveBack() {
    if (Held* displaced = spare().exchange(held_.release(), std::memory_order_acq_rel)) {
      std::lock_guard<std::mutex> lock(mu());
      kept().emplace_back(displaced);
    }
  }
  char* data() { return held_->bytes.data(); }
  Requests& requests() { return held_->requests; }

 private:
  struct Held {
    std::vector<char> bytes;
    Requests requests;
  };
  // The last one given back waits in a slot taken without a lock (legs one after another, as
  // a loop's, take and give back one each); the others in a list under a lock.
  static std::unique_ptr<Held> Take() {
    if (Held* last = spare().exchange(nullptr, std::memory_order_acq_rel)) return std::unique_ptr<Held>(last);
    std::lock_guard<std::mutex> lock(mu());
    if (kept().empty()) return std::make_unique<Held>();
    std::unique_ptr<Held> held = std::move(kept().back());
    kept().pop_back();
    return held;
  }
  static std::atomic<Held*>& spare() {
    static std::atomic<Held*> slot{nullptr};
    return slot;
  }
  static std::mutex& mu() {
    static auto* m = new std::mutex();
    return *m;
  }
  static std::vector<std::unique_ptr<Held>>& kept() {
    static auto* k = new std::vector<std::unique_ptr<Held>>();
    return *k;
  }
  std::unique_ptr<Held> held_;
};

// One-shot and recursive doubling move a buffer in messages of at most this many bytes, each
// sent eagerly by the MPI, in one fragment (Open MPI over shared memory up to 4 KiB including its
// headers, over TCP 64 KiB): such a send needs no call of the receiver's after the one that
// completed the receive (which hands the fragment back), where a larger one may wait for the
// receiver's next call. So no process can be left waiting on one that left MPI, and these
// legs end without the Ring's farewells, a second round trip that MPI_Allreduce does not pay
// (docs/PERFORMANCE.md, "Small messages, in plain jit"). Messages between two
// processes with one tag are matched in the order posted, so the pieces of successive legs and
// of one buffer never mix.
constexpr int64_t kEagerPieceBytes = 3840;  // 4 KiB less room for the MPI's headers

// Posts `bytes` at `data` as pieces of at most kEagerPieceBytes (one empty message for an
// empty buffer), each a receive from `peer` where `receive`, else a send to it, appending
// their requests and `peer` to *requests and *peers.
void PostPieces(bool receive, const void* data, int64_t bytes, int peer, const Leg& leg,
                std::vector<MPI_Request>* requests, std::vector<int>* peers) {
  char* at = static_cast<char*>(const_cast<void*>(data));
  int64_t offset = 0;
  do {
    const int piece = static_cast<int>(bytes - offset < kEagerPieceBytes ? bytes - offset : kEagerPieceBytes);
    requests->push_back(MPI_REQUEST_NULL);
    peers->push_back(peer);
    if (receive) {
      MPI_Irecv(at + offset, piece, MPI_BYTE, peer, leg.plan->tag, leg.comm, &requests->back());
    } else {
      MPI_Isend(at + offset, piece, MPI_BYTE, peer, leg.plan->tag, leg.comm, &requests->back());
    }
    offset += piece;
  } while (offset < bytes);
}

// The number of pieces PostPieces cuts `bytes` into.
int64_t PiecesOf(int64_t bytes) {
  return bytes <= kEagerPieceBytes ? 1 : (bytes + kEagerPieceBytes - 1) / kEagerPieceBytes;
}

// One-shot: every process sends its whole buffer to every other at once and
// reduces all of them in rank order.
template <typename T, Reduction R>
class OneShot final : public LegInFlight {
 public:
  OneShot(const T* in, T* out, int64_t elements, Leg leg)
      : in_(in), out_(out), elements_(elements), leg_(leg),
        others_(static_cast<size_t>(elements) * leg_.size * sizeof(T)) {
    const int64_t bytes = elements * static_cast<int64_t>(sizeof(T));
    const size_t messages = static_cast<size_t>(PiecesOf(bytes) * (leg_.size - 1));
    receives_.reserve(messages);
    receive_peers_.reserve(messages);
    sends_.reserve(messages);
    send_peers_.reserve(messages);
    for (int p = 0; p < leg_.size; ++p) {
      if (p != leg_.rank) PostPieces(true, others_.data() + p * bytes, bytes, p, leg_, &receives_, &receive_peers_);
    }
    for (int i = 1; i < leg_.size; ++i) {  // to the right first: no process is everyone's first
      PostPieces(false, in, bytes, (leg_.rank + i) % leg_.size, leg_, &sends_, &send_peers_);
    }
  }

  bool Finish(Clock::duration patience, std::string* error) override {
    if (!summed_) {
      if (!AwaitAll(receives_, patience, "for their buffers", error)) return false;
      if (!error->empty()) return true;
      Sum();
      summed_ = true;
    }
    if (!AwaitAll(sends_, patience, "for its buffer to be taken", error)) return false;
    if (error->empty()) others_.GiveBack();
    return true;
  }

 private:
  // Await of every one of `requests`.
  bool AwaitAll(std::vector<MPI_Request>& requests, Clock::duration patience, const char* waiting_for,
                std::string* error) {
    int rc = MPI_SUCCESS;
    return Await(
        patience, leg_, &rc, [&] { return AllTested(requests, &rc); },
        [&] { return TimedOut(receives_, receive_peers_, sends_, send_peers_, leg_); },
        [&] { return Failed(leg_, rc, -1, waiting_for); }, error);
  }

  // Rank 0's + rank 1's + ...: every process rounds the same terms in the
  // same order and ends with the same bits.
  // A 16-bit float adds in float32 and is rounded once, at the end.
  void Sum() {
    const T* theirs = reinterpret_cast<const T*>(others_.data());
    // This rank's slot of others_ is unused: its term is the input.
    auto term = [&](int p) { return p == leg_.rank ? in_ : theirs + p * elements_; };
    for (int64_t j = 0; j < elements_; ++j) {
      auto total = ToAcc(term(0)[j]);
      for (int p = 1; p < leg_.size; ++p) total = Combine<R>::Of(total, ToAcc(term(p)[j]));
      Store(total, out_ + j);
    }
  }

  const T* in_;
  T* out_;
  int64_t elements_;
  Leg leg_;
  Scratch others_;  // every other process' buffer, by rank
  // The pieces (PostPieces).
  std::vector<MPI_Request>& receives_ = others_.requests().receives;
  std::vector<MPI_Request>& sends_ = others_.requests().sends;
  std::vector<int>& receive_peers_ = others_.requests().receive_peers;
  std::vector<int>& send_peers_ = others_.requests().send_peers;
  bool summed_ = false;
};

// Recursive doubling (a power-of-two number of processes, small buffers, no
// 16-bit float: mpi.py's lowering chooses it): at step k
// each process swaps its partial result with rank ^ 2^k and combines the two,
// the lower ranks' first, so both partners hold the same bits; log2(size)
// exchanges of one buffer each way, where one-shot has every process send
// size - 1 and receive as many. The terms are combined pairwise (rank 0's with
// rank 1's, ...), not in rank order: within rounding of one-shot's result.
template <typename T, Reduction R>
class Doubling final : public LegInFlight {
 public:
  Doubling(const T* in, T* out, int64_t elements, Leg leg)
      : in_(in), out_(out), elements_(elements), leg_(leg),
        theirs_(static_cast<size_t>(elements) * sizeof(T)) {
    Post();
  }

  bool Finish(Clock::duration patience, std::string* error) override {
    while (bit_ < leg_.size) {
      int rc = MPI_SUCCESS;
      if (!Await(
              patience, leg_, &rc,
              [&] { return AllTested(receive_, &rc) && (rc != MPI_SUCCESS || AllTested(send_, &rc)); },
              [&] { return TimedOut(receive_, receive_peers_, send_, send_peers_, leg_); },
              [&] { return Failed(leg_, rc, partner_, "for a partial result"); }, error)) {
        return false;
      }
      if (!error->empty()) return true;
      const T* mine = bit_ == 1 ? in_ : out_;
      const T* theirs = reinterpret_cast<const T*>(theirs_.data());
      const bool lower = leg_.rank < partner_;
      for (int64_t j = 0; j < elements_; ++j) {
        const T& first = lower ? mine[j] : theirs[j];
        const T& second = lower ? theirs[j] : mine[j];
        Store(Combine<R>::Of(ToAcc(first), ToAcc(second)), out_ + j);
      }
      bit_ <<= 1;
      if (bit_ < leg_.size) Post();
    }
    theirs_.GiveBack();
    return true;
  }

 private:
  // Step log2(bit_)'s exchange with rank ^ bit_: this process' input at the first step, else its partial result.
  void Post() {
    partner_ = leg_.rank ^ static_cast<int>(bit_);
    const int64_t bytes = elements_ * static_cast<int64_t>(sizeof(T));
    theirs_.requests().Clear();
    PostPieces(true, theirs_.data(), bytes, partner_, leg_, &receive_, &receive_peers_);
    PostPieces(false, bit_ == 1 ? in_ : out_, bytes, partner_, leg_, &send_, &send_peers_);
  }

  const T* in_;
  T* out_;
  int64_t elements_;
  Leg leg_;
  Scratch theirs_;  // the partner's partial result
  int64_t bit_ = 1;
  int partner_ = 0;  // this step's
  // This step's pieces (PostPieces).
  std::vector<MPI_Request>& receive_ = theirs_.requests().receives;
  std::vector<MPI_Request>& send_ = theirs_.requests().sends;
  std::vector<int>& receive_peers_ = theirs_.requests().receive_peers;
  std::vector<int>& send_peers_ = theirs_.requests().send_peers;
};

// The ring (file comment).
template <typename T, Reduction R>
class Ring final : public LegInFlight {
 public:
  Ring(const T* in, T* out, int64_t elements, Leg leg)
      : in_(in), out_(out), leg_(leg),
        left_(static_cast<int>(Mod(leg_.rank - 1, leg_.size))),
        right_(static_cast<int>(Mod(leg_.rank + 1, leg_.size))),
        mine_(SchedulePlan::Make(leg_.plan->mode, elements, leg_.size, leg_.rank, PieceLength(leg_), 1)),
        theirs_(SchedulePlan::Make(leg_.plan->mode, elements, leg_.size, right_, PieceLength(leg_), 1)),
        stages_(mine_.StageCount()), slices_(mine_.slices),
        slots_(static_cast<size_t>(slices_ * mine_.slice_len) * sizeof(T)),
        receives_(stages_, MPI_REQUEST_NULL), sends_(stages_, MPI_REQUEST_NULL),
        lefts_(stages_, left_), rights_(stages_, right_) {
    Post();
  }

  bool Finish(Clock::duration patience, std::string* error) override {
    int rc = MPI_SUCCESS;
    while (done_ < stages_) {
      Post();
      if (receives_[done_] != MPI_REQUEST_NULL) {
        if (!Await(
                patience, leg_, &rc, [&] { return Tested(&receives_[done_], &rc); },
                [&] { return TimedOut(receives_, lefts_, sends_, rights_, leg_); },
                [&] { return Failed(leg_, rc, left_, "for a chunk"); }, error)) {
          return false;
        }
        if (!error->empty()) return true;
      }
      const Stage st = mine_.StageAt(done_);
      if (st.kind == StageKind::kSeed) {  // the all-gather's own chunk, at its offset in both buffers
        if (in_ != out_) std::memcpy(out_ + st.dst, in_ + st.dst, st.count * sizeof(T));
      } else if (st.kind != StageKind::kCopy) {  // a reduction, written where it reads (file comment)
        const T* partial = Slot(done_);
        // A 16-bit float adds in float32; the partial result crosses in its own type.
        for (int64_t j = 0; j < st.count; ++j) {
          Store(Combine<R>::Of(ToAcc(partial[j]), ToAcc(in_[st.src + j])), out_ + st.src + j);
        }
      }
      ++done_;
    }
    if (!Await(
            patience, leg_, &rc, [&] { return AllTested(sends_, &rc); },
            [&] { return TimedOut(receives_, lefts_, sends_, rights_, leg_); },
            [&] { return Failed(leg_, rc, right_, "for its chunks to be taken"); }, error)) {
      return false;
    }
    if (!error->empty()) return true;
    if (!farewells_.posted()) farewells_.Post({right_}, {left_}, leg_);
    if (!farewells_.Finish(patience, leg_, error)) return false;
    if (error->empty()) slots_.GiveBack();
    return true;
  }

 private:
  // The plan counts elements; T is a component, two to a complex number (kElementTypes).
  static int64_t PieceLength(const Leg& leg) {
    return Max(leg.plan->piece_elements * ffi::ByteWidth(leg.plan->type->type) / static_cast<int64_t>(sizeof(T)), 1);
  }

  // The left's partial sums land in one slot per receive posted ahead (a
  // step's worth), not in the output: the output may be the input itself
  // (mpi.py aliases them for the ring).
  T* Slot(int64_t stage) {
    return reinterpret_cast<T*>(slots_.data()) + (stage % slices_) * mine_.slice_len;
  }

  // Posts the sends and receives that may go now.
  void Post() {
    // Stage i of the right reads this rank's input in step 0, else what this
    // rank's stage i - slices (the same slice, one step earlier) wrote.
    for (; sent_ < stages_ && (sent_ < slices_ || sent_ - slices_ < done_); ++sent_) {
      const Stage rt = theirs_.StageAt(sent_);
      if (rt.count == 0 || rt.kind == StageKind::kSeed) continue;
      const bool from_input = rt.kind == StageKind::kReduceFirst || rt.left_is_input;
      const T* source = (from_input ? in_ : out_) + rt.src;
      MPI_Isend(source, static_cast<int>(rt.count * sizeof(T)), MPI_BYTE, right_, leg_.plan->tag,
                leg_.comm, &sends_[sent_]);
    }
    // The all-gather's slices are received straight into the output: a
    // stage's destination is never what a pending send reads (the
    // ring_schedule.h schedule: the left sends a slice of the all-gather only
    // after the right took this rank's partial sum of it, or, at its first
    // step, this rank's input of it), however early the receive is posted.
    // Posted as far ahead as the left posts its sends (a step): a send that
    // finds no receive posted goes through Open MPI's unexpected-message
    // path, which halved the ring's throughput over TCP once a step held more
    // than the 8 slices then posted ahead (docs/PERFORMANCE.md, "Over the
    // network").
    for (; received_ < stages_ && received_ < done_ + slices_; ++received_) {
      const Stage st = mine_.StageAt(received_);
      if (st.count == 0 || st.kind == StageKind::kSeed) continue;
      T* into = st.kind == StageKind::kCopy ? out_ + st.dst : Slot(received_);
      MPI_Irecv(into, static_cast<int>(st.count * sizeof(T)), MPI_BYTE, left_, leg_.plan->tag,
                leg_.comm, &receives_[received_]);
    }
  }

  const T* in_;
  T* out_;
  Leg leg_;
  int left_, right_;
  SchedulePlan mine_, theirs_;
  int64_t stages_, slices_;
  Scratch slots_;
  std::vector<MPI_Request> receives_, sends_;
  std::vector<int> lefts_, rights_;
  int64_t sent_ = 0, received_ = 0, done_ = 0;  // stages posted, posted, summed
  Farewells farewells_;
};

// A leg of one process: its own buffer is the sum.
class Alone final : public LegInFlight {
 public:
  bool Finish(Clock::duration, std::string* error) override {
    *error = "";
    return true;
  }
};

template <typename T, Reduction R>
std::unique_ptr<LegInFlight> Start(const T* in, T* out, int64_t elements, Leg leg) {
  if (leg.size == 1) {
    if (out != in) std::memcpy(out, in, elements * sizeof(T));
    return std::make_unique<Alone>();
  }
  if (leg.plan->algorithm == LegAlgorithm::kDoubling) return std::make_unique<Doubling<T, R>>(in, out, elements, leg);
  if (leg.plan->algorithm == LegAlgorithm::kOneShot) return std::make_unique<OneShot<T, R>>(in, out, elements, leg);
  return std::make_unique<Ring<T, R>>(in, out, elements, leg);
}

// Calls visit(T{}) with the C++ type of the component type `type` of
// ring_handler_common.h's kElementTypes.
template <typename Visit>
void VisitComponentType(ffi::DataType type, Visit visit) {
  switch (type) {
    case ffi::DataType::BF16: visit(Bf16{}); return;
    case ffi::DataType::F16: visit(_Float16{}); return;
    case ffi::DataType::F32: visit(float{}); return;
    case ffi::DataType::F64: visit(double{}); return;
    case ffi::DataType::S8: visit(int8_t{}); return;
    case ffi::DataType::S16: visit(int16_t{}); return;
    case ffi::DataType::S32: visit(int32_t{}); return;
    case ffi::DataType::S64: visit(int64_t{}); return;
    case ffi::DataType::U8: visit(uint8_t{}); return;
    case ffi::DataType::U16: visit(uint16_t{}); return;
    case ffi::DataType::U32: visit(uint32_t{}); return;
    case ffi::DataType::U64: visit(uint64_t{}); return;
    default: return;  // kElementTypes has no other component type
  }
}

}  // namespace

ffi::Error OpenLeg(int64_t plan_id, int32_t device_ordinal, ffi::DataType type, Leg* leg) {
  const LegPlan* plan = FindLegPlan(plan_id);
  if (plan == nullptr) {
    return ffi::Error::InvalidArgument("jaxring: no leg across processes has plan " + std::to_string(plan_id) +
                                       " in this process; jaxring/collectives/mpi.py registers each leg's plan "
                                       "when it lowers it");
  }
  if (static_cast<size_t>(device_ordinal) >= plan->devices.size() ||
      plan->devices[device_ordinal].comm == MPI_COMM_NULL) {
    return ffi::Error::InvalidArgument(
        "jaxring: no MPI communicator " + std::to_string(plan->comm_id) + " for device " +
        std::to_string(device_ordinal) + " (" + plan->what + "); jaxring/collectives/mpi.py sets one per "
        "communicator and local device");
  }
  if (type != plan->type->type) {
    return ffi::Error::InvalidArgument("jaxring: the leg across processes (" + plan->what + ") was lowered for " +
                                       plan->type->name + " and got another type");
  }
  const DeviceComm& device = plan->devices[device_ordinal];
  *leg = {plan, device.comm, device.rank, device.size, device_ordinal, DeadlineFor(plan->timeout_ms)};
  return ffi::Error::Success();
}

std::unique_ptr<LegInFlight> StartLeg(const void* in, void* out, int64_t elements, Leg leg) {
  // A complex number is two components, reduced one by one (kElementTypes).
  const ElementType& type = *leg.plan->type;
  const int64_t components = ffi::ByteWidth(type.type) / ffi::ByteWidth(type.component);
  std::unique_ptr<LegInFlight> started;
  VisitComponentType(type.component, [&](auto zero) {
    using T = decltype(zero);
    const T* typed_in = static_cast<const T*>(in);
    T* typed_out = static_cast<T*>(out);
    const int64_t count = elements * components;
    // The reduction is a template argument, chosen once per leg: the per-element loops have no branch on it.
    switch (leg.plan->reduction) {
      case Reduction::kMax:
        started = Start<T, Reduction::kMax>(typed_in, typed_out, count, leg);
        break;
      case Reduction::kMin:
        started = Start<T, Reduction::kMin>(typed_in, typed_out, count, leg);
        break;
      default:
        started = Start<T, Reduction::kSum>(typed_in, typed_out, count, leg);
    }
  });
  return started;
}

std::string RunHostRing(const void* in, void* out, int64_t elements, Leg leg) {
  std::string error;
  StartLeg(in, out, elements, leg)->Finish(Clock::duration::max(), &error);
  return error;
}

void SetLegSpinUs(int64_t us) { spin_ns.store(us * 1000, std::memory_order_relaxed); }

}  // namespace jaxring
