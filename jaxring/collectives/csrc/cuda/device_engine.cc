// The device engine's host side (device_engine.h): preparation, rings,
// the per-execution meetings and their sessions, failure records, engine choice.
#include "cuda/device_engine.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <tuple>

#include "core/meeting.h"
#include "core/timeout.h"

namespace jaxring {
namespace {

// Distinct device sets whose ranks get failure records (one set per ring of
// GPUs, whatever its ops).
constexpr int64_t kFailureSets = 64;
constexpr int64_t kRecordsPerSet = int64_t{kMaxDeviceRanks} * kMaxLanes;
// Buffers a rank remembers as readable by its peers (XLA reuses a few).
constexpr size_t kRememberedBuffers = 32;

std::atomic<uint64_t> next_engine_id{1};

std::string Hex(const void* p) {
  char text[32];
  std::snprintf(text, sizeof text, "%p", p);
  return text;
}

std::string DeviceList(const std::vector<int>& devices) {
  std::string text = "[";
  for (size_t i = 0; i < devices.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(devices[i]);
  }
  return text + "]";
}

}  // namespace

// What a rank tells its peers at a meeting.
struct Published {
  RankBuffers buffers{};
  std::string problem;  // why this rank cannot run the call; "" if it can
};

// The flags of one meeting (core/meeting.h) at a time: a flag block per rank,
// the epoch the meeting opened with, and what its ranks published. Written
// under its ring's lock, except `published[r]` (by rank r before it arrives;
// read by its peers once every rank arrived) and the atomics.
struct DeviceEngine::Session : Meeting {
  using Meeting::Meeting;
  std::vector<uint64_t*> flag_blocks;  // per rank, kSlotWords in its device's pool
  std::vector<int64_t> slots;          // per rank, the block's index in finished_host_
  std::vector<uint64_t> blocks_done;   // per rank: kernel blocks launched on its block
  std::vector<Published> published;
  uint64_t epoch = 0;
  std::atomic<int64_t> arrived{0};  // of the ranks that came, those that published
};

struct DeviceEngine::Ring {
  uint64_t serial = 0;  // 1 + the rings made before it, for KernelArgs::call_tag
  std::vector<int> devices;
  bool use_device = false;
  int64_t failure_set = -1;  // index of its device set's failure records
  std::unique_ptr<Meetings<Session>> meetings;  // its lock guards everything below
  uint64_t epochs = 0;  // meetings opened; a meeting's epoch is the count at its opening
  // A few at a time (the meetings open and those whose kernels run), so a
  // free one is found by a scan, with no allocation per call.
  std::vector<std::unique_ptr<Session>> sessions;
  // By rank, under its own lock (a rank may be in several calls at once):
  // the buffers every peer device was found to read.
  std::unique_ptr<std::mutex[]> readable_mu;
  std::vector<std::vector<const void*>> readable;
};

DeviceEngine::DeviceEngine(CudaSeam* seam, EngineOptions options)
    : seam_(seam), options_(std::move(options)), id_(next_engine_id++) {}

DeviceEngine::~DeviceEngine() = default;

namespace {

int64_t LanesOf(const RingCall& call, const SchedulePlan& plan, int64_t element_bytes,
                bool one_shot) {
  const int64_t bytes = (one_shot ? call.elements : plan.slice_len) * element_bytes;
  return std::clamp<int64_t>((bytes + kBytesPerLane - 1) / kBytesPerLane, 1, kMaxLanes);
}

}  // namespace

int64_t DeviceEngine::Lanes(const RingCall& call, int64_t element_bytes, bool one_shot) {
  return LanesOf(call,
                 SchedulePlan::Make(call.mode, call.elements, call.ranks, call.rank,
                                    call.slice_elements, call.align),
                 element_bytes, one_shot);
}

// Once per process, before any ring exists and so before any ring kernel can
// spin: everything that may synchronise a device.
std::string DeviceEngine::Prepare() {
  if (prepared_) return prepare_error_;
  prepared_ = true;
  const int count = seam_->DeviceCount();
  links_.assign(count, std::vector<PeerLink>(count, PeerLink::kNvlink));
  for (int d = 0; d < count && prepare_error_.empty(); ++d) {
    prepare_error_ = seam_->LoadKernels(d);
    void* pool = nullptr;
    if (prepare_error_.empty()) {
      prepare_error_ = seam_->AllocZeroedDevice(
          d, static_cast<size_t>(options_.pool_slots) * kSlotWords * sizeof(uint64_t), &pool);
    }
    pools_.push_back(static_cast<uint64_t*>(pool));
    pool_used_.push_back(0);
  }
  for (int a = 0; a < count && prepare_error_.empty(); ++a) {
    for (int b = 0; b < count && prepare_error_.empty(); ++b) {
      if (a == b) continue;
      // Every pair that can, PCIe too: the host-staged engine, which rings
      // over PCIe take, would enable it later, while other rings' kernels spin.
      links_[a][b] = seam_->Link(a, b);
      if (links_[a][b] != PeerLink::kNone) prepare_error_ = seam_->EnablePeerAccess(a, b);
    }
  }
  if (prepare_error_.empty()) {
    void *host = nullptr, *device_view = nullptr;
    prepare_error_ = seam_->AllocMappedHost(
        static_cast<size_t>(kFailureSets * kRecordsPerSet) * sizeof(LaneFailureRecord), &host,
        &device_view);
    failure_host_ = static_cast<LaneFailureRecord*>(host);
    failure_device_ = static_cast<LaneFailureRecord*>(device_view);
  }
  if (prepare_error_.empty()) {
    void *host = nullptr, *device_view = nullptr;
    prepare_error_ = seam_->AllocMappedHost(
        static_cast<size_t>(count * options_.pool_slots) * sizeof(uint64_t), &host, &device_view);
    finished_host_ = static_cast<uint64_t*>(host);
    finished_device_ = static_cast<uint64_t*>(device_view);
  }
  if (!prepare_error_.empty()) {
    prepare_error_ = "jaxring device ring: preparing the devices failed: " + prepare_error_;
  }
  return prepare_error_;
}

DeviceEngine::Ring* DeviceEngine::RingFor(const RingCall& call, const std::vector<int>& devices,
                                          int device, std::string* error) {
  // Each handler thread finds its rings without a lock after the first call.
  thread_local std::map<std::tuple<uint64_t, int64_t, int64_t>, Ring*> cache;
  const auto cache_key = std::make_tuple(id_, call.key.op_id, call.key.group);
  auto hit = cache.find(cache_key);
  Ring* ring = hit == cache.end() ? nullptr : hit->second;
  if (ring == nullptr) {
    std::lock_guard<std::mutex> lock(mu_);
    if (*error = Prepare(); !error->empty()) return nullptr;
    auto& slot = rings_[{call.key.op_id, call.key.group}];
    if (slot == nullptr) {
      auto made = std::make_unique<Ring>();
      made->serial = rings_.size() + 1;
      made->devices = devices;
      made->meetings = std::make_unique<Meetings<Session>>(call.key.op_id, call.key.group,
                                                           static_cast<int64_t>(devices.size()));
      made->readable_mu.reset(new std::mutex[devices.size()]);
      made->readable.resize(devices.size());
      std::string why;
      if (call.ranks > kMaxDeviceRanks) {
        why = "more than " + std::to_string(kMaxDeviceRanks) + " ranks";
      }
      for (int a : devices) {
        for (int b : devices) {
          if (!why.empty() || a == b) continue;
          if (a < 0 || b < 0 || a >= static_cast<int>(links_.size()) ||
              b >= static_cast<int>(links_.size())) {
            why = "device " + std::to_string(a < 0 || a >= static_cast<int>(links_.size()) ? a : b) +
                  " is not a device of this process";
          } else if (links_[a][b] == PeerLink::kNone) {
            why = "device " + std::to_string(a) + " cannot map device " + std::to_string(b);
          } else if (links_[a][b] == PeerLink::kPcie && !options_.any_link) {
            why = "devices " + std::to_string(a) + " and " + std::to_string(b) +
                  " are linked over PCIe only, where polling a peer's memory is slow "
                  "(JAXRING_CUDA_ENGINE=device-any-link runs the device engine anyway)";
          }
        }
      }
      if (why.empty() && !failure_sets_.count(devices)) {
        if (static_cast<int64_t>(failure_sets_.size()) == kFailureSets) {
          why = "more than " + std::to_string(kFailureSets) + " distinct rings of devices";
        } else {
          const int64_t index = static_cast<int64_t>(failure_sets_.size());
          failure_sets_[devices] = index;
        }
      }
      if (why.empty()) made->failure_set = failure_sets_.at(devices);
      made->use_device = why.empty();
      if (options_.log) {
        options_.log("jaxring: op " + std::to_string(call.key.op_id) + " group " +
                     std::to_string(call.key.group) + " on devices " + DeviceList(devices) + ": " +
                     (why.empty() ? "device-synchronised engine"
                                  : "host-staged engine: " + why));
      }
      slot = std::move(made);
    }
    ring = slot.get();
    cache[cache_key] = ring;
  }
  if (ring->devices != devices) {
    *error = "jaxring device ring: op " + std::to_string(call.key.op_id) + " group " +
             std::to_string(call.key.group) + " first ran on devices " +
             DeviceList(ring->devices) + " and now on " + DeviceList(devices) +
             "; the device engine keys its flags by op id, so one traced collective cannot "
             "run on two sets of devices (trace it once per device set)";
    return nullptr;
  }
  if (ring->devices[call.rank] != device) {
    *error = "jaxring device ring: rank " + std::to_string(call.rank) + " of op " +
             std::to_string(call.key.op_id) + " runs on device " + std::to_string(device) +
             " but its ring places it on device " + std::to_string(ring->devices[call.rank]);
    return nullptr;
  }
  return ring;
}

std::string DeviceEngine::TakeFailure(const RingCall& call, const std::vector<int>& devices) {
  int64_t set;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = failure_sets_.find(devices);
    if (it == failure_sets_.end()) return "";
    set = it->second;
  }
  return TakeFailureOf(set, call.rank);
}

// Failure records are per (device set, rank), whatever the op: a failure
// fails the rank's next call of any op on that ring of devices.
std::string DeviceEngine::TakeFailureOf(int64_t set, int64_t rank) {
  LaneFailureRecord* records = failure_host_ + set * kRecordsPerSet + rank * kMaxLanes;
  std::string error;
  for (int lane = 0; lane < kMaxLanes; ++lane) {
    volatile LaneFailureRecord* record = records + lane;
    if (record->call == 0) continue;
    if (error.empty()) {
      error = DescribeLaneFailure(rank, LaneOutcome{false, record->peer, record->wanted,
                                                   record->seen});
    }
    record->call = 0;
  }
  return error;
}

namespace {

uint64_t LoadFinished(const uint64_t* word) { return __atomic_load_n(word, __ATOMIC_ACQUIRE); }
void StoreFinished(uint64_t* word, uint64_t epoch) { __atomic_store_n(word, epoch, __ATOMIC_RELEASE); }

}  // namespace

// A session no meeting holds and whose kernels have all finished, else a new
// one; nullptr (the caller waits) when max_sessions sessions wait for their
// kernels or the pool is used up, with *error set if the ring has no session
// to wait for. Sessions that meetings hold do not count: the
// ranks may open meetings in any order, and a meeting must never wait for
// another one to gather its ranks. Under the ring's lock.
DeviceEngine::Session* DeviceEngine::FreeSession(Ring* ring, std::string* error) {
  int64_t on_device = 0;
  for (const auto& session : ring->sessions) {
    if (session->open) continue;
    bool finished = true;
    for (int64_t slot : session->slots) finished &= LoadFinished(finished_host_ + slot) >= session->epoch;
    if (finished) return session.get();
    ++on_device;
  }
  if (on_device >= options_.max_sessions) return nullptr;
  const int64_t ranks = static_cast<int64_t>(ring->devices.size());
  std::lock_guard<std::mutex> lock(mu_);
  for (int device : ring->devices) {
    if (pool_used_[device] + std::count(ring->devices.begin(), ring->devices.end(), device) >
        options_.pool_slots) {
      if (ring->sessions.empty()) {
        *error = "jaxring device ring: device " + std::to_string(device) + "'s pool of " +
                 std::to_string(options_.pool_slots) +
                 " ring flag blocks is used up (one per rank of each collective op, and more per "
                 "op while executions are queued); use fewer distinct collectives (larger "
                 "buckets) or JAXRING_CUDA_ENGINE=host";
      }
      return nullptr;
    }
  }
  auto session = std::make_unique<Session>(ranks);
  for (int device : ring->devices) {
    const int64_t slot = pool_used_[device]++;
    session->flag_blocks.push_back(pools_[device] + slot * kSlotWords);
    session->slots.push_back(device * options_.pool_slots + slot);
  }
  session->blocks_done.assign(ranks, 0);
  session->published.resize(ranks);
  ring->sessions.push_back(std::move(session));
  return ring->sessions.back().get();
}

// Rank `call.rank` comes to its meeting of execution `run_id` and arrives
// there with what it publishes: the session of that meeting (opened by the
// first rank to come), or nullptr with *error when the meeting already failed
// (this rank then leaves it) or no session came free before the deadline.
DeviceEngine::Session* DeviceEngine::Join(Ring* ring, const RingCall& call, int64_t run_id,
                                          Published mine, std::string* error) {
  Meetings<Session>& meetings = *ring->meetings;
  MeetingKey key{};
  Clock::time_point deadline;
  for (int spins = 0;; ++spins) {
    {
      std::lock_guard<std::mutex> lock(meetings.mu());
      if (spins == 0) key = meetings.NextCall(call.rank, run_id);
      Session* session = meetings.Find(key);
      if (session == nullptr) {
        session = FreeSession(ring, error);
        if (session != nullptr) {
          session->epoch = ++ring->epochs;
          session->arrived.store(0, std::memory_order_relaxed);
          meetings.Open(key, session);
        }
      }
      if (session != nullptr) {
        if (!meetings.Join(session, call.rank, error)) {
          if (Left(ring, session, call.rank, /*launched=*/false)) meetings.Close(session);
          return nullptr;
        }
        session->published[call.rank] = std::move(mine);
        session->arrived.fetch_add(1, std::memory_order_release);
        return session;
      }
      if (!error->empty()) return nullptr;
      // Every session is held by kernels still on the device (or, with the
      // pool used up, by other meetings): wait for them.
      if (spins == 0) deadline = DeadlineFor(call.timeout_ms);
      if ((spins & 63) == 0 && Clock::now() > deadline) {
        *error = "jaxring device ring: op " + std::to_string(call.key.op_id) + ": rank " +
                 std::to_string(call.rank) + " found all " + std::to_string(ring->sessions.size()) +
                 " flag sessions of the op in use until the timeout, in " + CallName(key) +
                 ": held by kernels of earlier executions that had not finished (one is stuck on "
                 "the device) or, with the pool of flag blocks used up, by meetings of other "
                 "executions that never gathered their ranks";
        return nullptr;
      }
    }
    std::this_thread::yield();
  }
}

// A rank is done with its meeting: leaves it, and the last to leave closes it;
// its session serves a later meeting once every rank's kernel has finished.
void DeviceEngine::Leave(Ring* ring, Session* session, int64_t rank, bool launched) {
  if (!Left(ring, session, rank, launched)) return;
  std::lock_guard<std::mutex> lock(ring->meetings->mu());
  ring->meetings->Close(session);
}

// Counts `rank` out of its meeting (a rank that did not launch reports its
// flags unused at once); true for the last rank to leave.
bool DeviceEngine::Left(Ring* ring, Session* session, int64_t rank, bool launched) {
  if (!launched) StoreFinished(finished_host_ + session->slots[rank], session->epoch);
  return ring->meetings->Leave(session);
}

// Why this rank cannot run its call ("" if it can), for its peers.
std::string DeviceEngine::Problem(Ring* ring, const RingCall& call, const DeviceRank& me) {
  std::string problem = TakeFailureOf(ring->failure_set, call.rank);
  if (!problem.empty()) {
    return "its previous call timed out on the device (its output was poisoned): " + problem;
  }
  // Peers read this rank's input, output and partial sums: each must be
  // mapped into every peer device (memory from cudaMallocAsync pools or VMM
  // is not, whatever peer access says).
  std::lock_guard<std::mutex> lock(ring->readable_mu[call.rank]);
  auto& known = ring->readable[call.rank];
  for (const void* buffer : {me.in, static_cast<const void*>(me.out), static_cast<const void*>(me.acc)}) {
    if (buffer == nullptr || std::find(known.begin(), known.end(), buffer) != known.end()) continue;
    for (int peer : ring->devices) {
      if (peer == me.device) continue;
      if (std::string why = seam_->PeerCanRead(buffer, peer); !why.empty()) {
        return "its buffer " + Hex(buffer) + " on device " + std::to_string(me.device) +
               " cannot be read by device " + std::to_string(peer) + " (" + why +
               "); XLA's default BFC allocator (XLA_PYTHON_CLIENT_ALLOCATOR=default) "
               "gives peer-mapped memory, or use JAXRING_CUDA_ENGINE=host";
      }
    }
    if (known.size() == kRememberedBuffers) known.erase(known.begin());
    known.push_back(buffer);
  }
  return "";
}

// Waits until every rank has arrived at `session`'s meeting: true then, else
// false with *error (the meeting is then broken, and no rank launches).
bool DeviceEngine::EveryoneArrived(Ring* ring, Session* session, const RingCall& call,
                                   std::string* error) {
  const int64_t ranks = static_cast<int64_t>(ring->devices.size());
  const auto deadline = DeadlineFor(call.timeout_ms);
  for (int spins = 0;; ++spins) {
    if (session->arrived.load(std::memory_order_acquire) == ranks) return true;
    if (session->broken.load(std::memory_order_acquire)) break;
    if (spins < 64) continue;
    if ((spins & 63) == 0 && Clock::now() > deadline) {
      std::lock_guard<std::mutex> lock(ring->meetings->mu());
      if (session->arrived.load(std::memory_order_acquire) == ranks) return true;
      *error = ring->meetings->Break(session, ring->meetings->NeverArrived(*session, call.rank));
      return false;
    }
    std::this_thread::yield();
  }
  std::lock_guard<std::mutex> lock(ring->meetings->mu());
  *error = session->broken_why;
  return false;
}

DeviceEngine::Outcome DeviceEngine::Run(const RingCall& call, const DeviceRank& me,
                                        const std::vector<int>& devices, DevicePath path,
                                        std::string* error) {
  Ring* ring = RingFor(call, devices, me.device, error);
  if (ring == nullptr) return Outcome::kFailed;
  if (!ring->use_device) return Outcome::kUseHostEngine;
  Session* session = Join(ring, call, me.run_id,
                          Published{RankBuffers{me.in, me.out, me.acc}, Problem(ring, call, me)}, error);
  if (session == nullptr) return Outcome::kFailed;
  if (!EveryoneArrived(ring, session, call, error)) {
    Leave(ring, session, call.rank, /*launched=*/false);
    return Outcome::kFailed;
  }
  KernelArgs args{};
  for (int64_t p = 0; p < call.ranks; ++p) {
    const Published& peer = session->published[p];
    if (!peer.problem.empty()) {
      *error = "jaxring device ring: op " + std::to_string(call.key.op_id) + " fails on every rank: rank " +
               std::to_string(p) + " reports that " + peer.problem;
      Leave(ring, session, call.rank, /*launched=*/false);
      return Outcome::kFailed;
    }
    args.flag_blocks[p] = session->flag_blocks[p];
    args.buffers[p] = peer.buffers;
  }
  const int64_t element_bytes = ElementBytes(call.element_type);
  const bool one_shot =
      path == DevicePath::kOneShot ||
      (path == DevicePath::kAuto && options_.one_shot_max_bytes &&
       call.elements * element_bytes <= options_.one_shot_max_bytes(call.ranks));
  args.plan = SchedulePlan::Make(call.mode, call.elements, call.ranks, call.rank,
                                 call.slice_elements, call.align);
  args.lanes = LanesOf(call, args.plan, element_bytes, one_shot);
  args.epoch = session->epoch;
  args.call_tag = ring->serial << 32 | session->epoch;
  args.one_shot = one_shot;
  args.reduction = call.reduction;
  args.failures = failure_device_ + ring->failure_set * kRecordsPerSet + call.rank * kMaxLanes;
  args.blocks_done = session->flag_blocks[call.rank] + kFlagWords;
  session->blocks_done[call.rank] += static_cast<uint64_t>(args.lanes);
  args.blocks_done_after = session->blocks_done[call.rank];
  args.finished = finished_device_ + session->slots[call.rank];
  const auto deadline = DeadlineFor(call.timeout_ms);
  args.timeout_ns = static_cast<uint64_t>(std::max<int64_t>(
      0, std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - Clock::now()).count()));
  *error = seam_->Launch(call.element_type, args, me.stream);
  Leave(ring, session, call.rank, /*launched=*/error->empty());
  return error->empty() ? Outcome::kLaunched : Outcome::kFailed;
}

}  // namespace jaxring
