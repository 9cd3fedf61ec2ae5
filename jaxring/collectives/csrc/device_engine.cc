// The device engine's host side (device_engine.h): preparation, rings,
// the lock-free per-call meeting, failure records, engine choice.
#include "device_engine.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <tuple>

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

// What a rank tells its peers at a call's meeting.
struct Published {
  RankBuffers buffers{};
  uint64_t* flag_block = nullptr;
  int64_t run_id = 0;
  std::string problem;  // why this rank cannot run the call; "" if it can
};

// One rank of a ring. Only that rank's handler thread writes it, except
// `published`, which peers read after the meeting. Two, alternating: a rank
// can publish for its next call while a slower peer still reads this one,
// but not two calls ahead (it would need that peer at the next meeting).
struct DeviceEngine::Rank {
  uint64_t* flag_block = nullptr;  // kSlotWords in its device's pool
  uint64_t meetings = 0;
  uint64_t blocks_done = 0;
  Published published[2];
  std::vector<const void*> readable;  // buffers every peer device was found to read
};

struct DeviceEngine::Ring {
  std::vector<int> devices;
  bool use_device = false;
  int64_t failure_set = -1;  // index of its device set's failure records
  std::vector<Rank> ranks;
  std::unique_ptr<std::atomic<uint64_t>[]> arrived;  // per rank: the last meeting it reached
  std::atomic<bool> broken{false};  // a meeting timed out: the ranks no longer agree on the count
  std::mutex broken_mu;
  std::string broken_why;
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
      made->devices = devices;
      made->ranks.resize(devices.size());
      made->arrived.reset(new std::atomic<uint64_t>[devices.size()]);
      for (size_t r = 0; r < devices.size(); ++r) made->arrived[r].store(0);
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
  // The rank's flag block, at its first call (whichever thread makes it).
  Rank& rank = ring->ranks[call.rank];
  if (ring->use_device && rank.flag_block == nullptr) {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t& used = pool_used_[device];
    if (used == options_.pool_slots) {
      *error = "jaxring device ring: device " + std::to_string(device) + "'s pool of " +
               std::to_string(options_.pool_slots) +
               " ring flag blocks is used up (one per collective op and rank); use fewer "
               "distinct collectives (larger buckets) or JAXRING_CUDA_ENGINE=host";
      return nullptr;
    }
    rank.flag_block = pools_[device] + used++ * kSlotWords;
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
    if (record->epoch == 0) continue;
    if (error.empty()) {
      error = DescribeLaneFailure(rank, LaneOutcome{false, record->peer, record->wanted,
                                                   record->seen});
    }
    record->epoch = 0;
  }
  return error;
}

DeviceEngine::Outcome DeviceEngine::Run(const RingCall& call, xla::ffi::DataType type,
                                        const DeviceRank& me, const std::vector<int>& devices,
                                        DevicePath path, std::string* error) {
  Ring* ring = RingFor(call, devices, me.device, error);
  if (ring == nullptr) return Outcome::kFailed;
  if (!ring->use_device) return Outcome::kUseHostEngine;
  if (ring->broken.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(ring->broken_mu);
    *error = ring->broken_why;
    return Outcome::kFailed;
  }
  Rank& rank = ring->ranks[call.rank];
  const uint64_t meeting = ++rank.meetings;
  Published& mine = rank.published[meeting % 2];
  mine.buffers = RankBuffers{me.in, me.out, me.acc};
  mine.flag_block = rank.flag_block;
  mine.run_id = me.run_id;
  mine.problem = TakeFailureOf(ring->failure_set, call.rank);
  if (!mine.problem.empty()) {
    mine.problem = "its previous call timed out on the device (its output was poisoned): " +
                   mine.problem;
  }
  // Peers read this rank's input, output and partial sums: each must be
  // mapped into every peer device (memory from cudaMallocAsync pools or VMM
  // is not, whatever peer access says).
  for (const void* buffer : {me.in, static_cast<const void*>(me.out), static_cast<const void*>(me.acc)}) {
    if (!mine.problem.empty() || buffer == nullptr) break;
    if (std::find(rank.readable.begin(), rank.readable.end(), buffer) != rank.readable.end()) continue;
    for (int peer : ring->devices) {
      if (peer == me.device) continue;
      if (std::string why = seam_->PeerCanRead(buffer, peer); !why.empty()) {
        mine.problem = "its buffer " + Hex(buffer) + " on device " + std::to_string(me.device) +
                       " cannot be read by device " + std::to_string(peer) + " (" + why +
                       "); XLA's default BFC allocator (XLA_PYTHON_CLIENT_ALLOCATOR=default) "
                       "gives peer-mapped memory, or use JAXRING_CUDA_ENGINE=host";
        break;
      }
    }
    if (mine.problem.empty()) {
      if (rank.readable.size() == kRememberedBuffers) rank.readable.erase(rank.readable.begin());
      rank.readable.push_back(buffer);
    }
  }
  // The meeting: publish, then wait for every rank to reach this meeting.
  ring->arrived[call.rank].store(meeting, std::memory_order_release);
  const auto deadline = DeadlineFor(call.timeout_ms);
  for (int64_t p = 0; p < call.ranks; ++p) {
    for (int spins = 0; ring->arrived[p].load(std::memory_order_acquire) < meeting; ++spins) {
      if (spins < 64) continue;
      if ((spins & 63) == 0 && Clock::now() > deadline) {
        std::lock_guard<std::mutex> lock(ring->broken_mu);
        if (ring->broken_why.empty()) {
          ring->broken_why =
              "jaxring device ring: rank " + std::to_string(p) + " of op " +
              std::to_string(call.key.op_id) + " never arrived at call " +
              std::to_string(meeting) + " (rank " + std::to_string(call.rank) +
              " waited until the timeout); every device of the axis must run the same "
              "collectives in the same order. This op stays failed: its ranks no longer agree "
              "on the call count.";
        }
        ring->broken.store(true, std::memory_order_release);
        *error = ring->broken_why;
        return Outcome::kFailed;
      }
      std::this_thread::yield();
    }
  }
  KernelArgs args{};
  for (int64_t p = 0; p < call.ranks; ++p) {
    const Published& peer = ring->ranks[p].published[meeting % 2];
    if (!peer.problem.empty()) {
      *error = "jaxring device ring: op " + std::to_string(call.key.op_id) + " fails on every rank: rank " +
               std::to_string(p) + " reports that " + peer.problem;
      return Outcome::kFailed;
    }
    if (peer.run_id != me.run_id) {
      *error = "jaxring device ring: op " + std::to_string(call.key.op_id) +
               " runs in two executions at once (run ids " + std::to_string(me.run_id) + " and " +
               std::to_string(peer.run_id) +
               "), which would share its flags; run the executions one after the other";
      return Outcome::kFailed;
    }
    args.flag_blocks[p] = peer.flag_block;
    args.buffers[p] = peer.buffers;
  }
  const int64_t element_bytes = ElementBytes(type);
  const bool one_shot =
      path == DevicePath::kOneShot ||
      (path == DevicePath::kAuto && options_.one_shot_max_bytes &&
       call.elements * element_bytes <= options_.one_shot_max_bytes(call.ranks));
  args.plan = SchedulePlan::Make(call.mode, call.elements, call.ranks, call.rank,
                                 call.slice_elements, call.align);
  args.lanes = LanesOf(call, args.plan, element_bytes, one_shot);
  args.epoch = meeting;
  args.one_shot = one_shot;
  args.failures = failure_device_ + ring->failure_set * kRecordsPerSet + call.rank * kMaxLanes;
  args.blocks_done = rank.flag_block + kFlagWords;
  rank.blocks_done += static_cast<uint64_t>(args.lanes);
  args.blocks_done_after = rank.blocks_done;
  args.timeout_ns = static_cast<uint64_t>(std::max<int64_t>(
      0, std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - Clock::now()).count()));
  if (*error = seam_->Launch(type, args, me.stream); !error->empty()) return Outcome::kFailed;
  return Outcome::kLaunched;
}

}  // namespace jaxring
