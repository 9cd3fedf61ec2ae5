// The device-synchronised CUDA ring engine: the kernel that runs
// ring_protocol.h with GPU primitives, and the host side that meets the
// other ranks once per call and launches it.
//
// Memory ordering (the PTX memory model, sm_70 and later). A lane publishes
// after __syncthreads(), so every thread's loads and stores of the lane's
// data so far happen before thread 0's st.release.sys of the flag; a waiter's
// thread 0 reads the flag with ld.acquire.sys and releases the block's other
// threads with a barrier after it. System scope because the flags and data
// cross GPUs over peer mappings; on one GPU it is merely stronger than needed.
#include "cuda_device_ring.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_elementwise.cuh"
#include "rendezvous.h"
#include "ring_protocol.h"

namespace jaxring {
namespace {

namespace ffi = xla::ffi;

constexpr int kThreads = 512;
// A lane per this many bytes of a stage (ring) or of a rank's output
// (one-shot), up to kMaxLanes: 4 packs of 16 bytes per thread.
constexpr int64_t kBytesPerLane = int64_t{kThreads} * 16 * 4;

// What a lane that gave up leaves for the host, in host-mapped memory;
// epoch 0: nothing to report.
struct LaneFailureRecord {
  uint64_t epoch;
  int64_t peer;
  uint64_t wanted;
  uint64_t seen;
};

struct KernelArgs {
  SchedulePlan plan;
  int64_t lanes;
  uint64_t epoch;
  bool one_shot;
  uint64_t timeout_ns;
  uint64_t* flag_blocks[kMaxDeviceRanks];
  RankBuffers buffers[kMaxDeviceRanks];
  LaneFailureRecord* failures;  // this rank's, one per lane
};

__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint64_t LoadAcquire(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void StoreRelease(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// ring_protocol.h's primitives for one block: thread 0 touches the flags,
// barriers order the other threads' data accesses around it.
struct DeviceSync {
  using Word = uint64_t;
  uint64_t deadline_ns;  // meaningful in thread 0

  __device__ void Publish(Word* const* words, int count, uint64_t value) {
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int i = 0; i < count; ++i) StoreRelease(words[i], value);
    }
  }

  __device__ bool Wait(const Word* word, uint64_t value, uint64_t* seen) {
    int timed_out = 0;
    if (threadIdx.x == 0) {
      uint64_t v = LoadAcquire(word);
      while (v < value) {
        if (GlobalTimerNs() > deadline_ns) {
          timed_out = 1;
          break;
        }
        __nanosleep(100);
        v = LoadAcquire(word);
      }
      *seen = v;
    }
    return !__syncthreads_or(timed_out);
  }
};

// One block per lane. Bounded registers (512 threads, two blocks per SM:
// at most 64 registers, no spills on sm_80/sm_90 with -Xptxas=-v) and bounded
// blocks (kMaxLanes) per rank let the ranks sharing a GPU be co-resident
// (docs/CUDA_RING.md).
template <typename T>
__global__ void __launch_bounds__(kThreads, 2) DeviceRingKernel(const KernelArgs args) {
  using Acc = typename AccumulatorOf<T>::type;
  DeviceSync sync{threadIdx.x == 0 ? GlobalTimerNs() + args.timeout_ns : 0};
  BlockElementwise ew;
  const LaneCall<uint64_t> call{args.plan.ranks(), args.plan.rank, args.lanes, blockIdx.x,
                                args.epoch, args.flag_blocks, args.buffers};
  const LaneOutcome outcome = args.one_shot ? RunOneShotLane<T>(args.plan, call, sync, ew)
                                            : RunRingLane<T, Acc>(args.plan, call, sync, ew);
  if (!outcome.ok && threadIdx.x == 0) {
    volatile LaneFailureRecord* record = args.failures + blockIdx.x;
    record->peer = outcome.peer;
    record->wanted = outcome.wanted;
    record->seen = outcome.seen;
    __threadfence_system();
    record->epoch = args.epoch;
  }
}

template <typename T>
cudaError_t Launch(const KernelArgs& args, cudaStream_t stream) {
  DeviceRingKernel<T><<<static_cast<unsigned>(args.lanes), kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

// --- host side -------------------------------------------------------------

// What a rank tells the others at the call's rendezvous.
struct Published {
  RankBuffers buffers;
  uint64_t* flag_block;
  uint64_t calls;  // this rank's count of calls of this ring, this one included
};

// One rank's persistent state in one ring (op id, group). Only that rank's
// handler thread writes it, except `published`, which the others read
// between the rendezvous and their launch. Two slots, alternating, because a
// rank can enter its next call (and publish again) while a slower peer still
// reads this call's slot, but not two calls ahead: it would need that peer at
// the next rendezvous first.
struct RankSlot {
  uint64_t* flag_block = nullptr;                 // kFlagWords, on the rank's device
  LaneFailureRecord* failures = nullptr;          // kMaxLanes, host-mapped
  LaneFailureRecord* device_failures = nullptr;   // the same, as the device sees it
  uint64_t calls = 0;
  Published published[2];
};

// Rings live for the process: their flags must keep growing across calls,
// and an op id is never reused.
RankSlot* SlotFor(const RingCall& call, std::string* error) {
  static std::mutex mu;
  static auto* rings = new std::map<std::pair<int64_t, int64_t>, std::vector<RankSlot>>();
  std::lock_guard<std::mutex> lock(mu);
  auto& ring = (*rings)[{call.key.op_id, call.key.group}];
  if (ring.empty()) ring.resize(call.ranks);
  if (static_cast<int64_t>(ring.size()) != call.ranks) {
    *error = "jaxring device ring: devices of one collective disagree on the ring size (" +
             std::to_string(ring.size()) + " vs " + std::to_string(call.ranks) + ")";
    return nullptr;
  }
  return &ring[call.rank];
}

std::string CudaError(const char* what, cudaError_t err) {
  return std::string("jaxring device ring: ") + what + ": " + cudaGetErrorString(err);
}

// Flags zeroed and failure records allocated at a rank's first call of a
// ring. The stream is synchronised so the zeros land before any peer (which
// launches only after this rank reaches the rendezvous) can publish.
std::string Allocate(RankSlot& slot, cudaStream_t stream) {
  cudaError_t err = cudaMalloc(&slot.flag_block, kFlagWords * sizeof(uint64_t));
  if (err == cudaSuccess) {
    err = cudaMemsetAsync(slot.flag_block, 0, kFlagWords * sizeof(uint64_t), stream);
  }
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  if (err == cudaSuccess) {
    err = cudaHostAlloc(&slot.failures, kMaxLanes * sizeof(LaneFailureRecord),
                        cudaHostAllocMapped | cudaHostAllocPortable);
  }
  if (err == cudaSuccess) {
    std::memset(slot.failures, 0, kMaxLanes * sizeof(LaneFailureRecord));
    err = cudaHostGetDevicePointer(reinterpret_cast<void**>(&slot.device_failures),
                                   slot.failures, 0);
  }
  return err == cudaSuccess ? "" : CudaError("allocating the ring's flags", err);
}

std::string TakeFailure(RankSlot& slot, int64_t rank) {
  if (slot.failures == nullptr) return "";
  std::string error;
  for (int lane = 0; lane < kMaxLanes; ++lane) {
    volatile LaneFailureRecord* record = slot.failures + lane;
    if (record->epoch == 0) continue;
    if (error.empty()) {
      error = DescribeLaneFailure(rank, LaneOutcome{false, record->peer, record->wanted,
                                                    record->seen});
    }
    record->epoch = 0;
  }
  return error;
}

template <typename T>
int64_t LanesFor(const RingCall& call, bool one_shot) {
  int64_t bytes;
  if (one_shot) {
    bytes = call.elements * static_cast<int64_t>(sizeof(T));
  } else {
    const SchedulePlan plan = SchedulePlan::Make(call.mode, call.elements, call.ranks, call.rank,
                                                 call.slice_elements, call.align);
    bytes = plan.slice_len * static_cast<int64_t>(sizeof(T));
  }
  return std::clamp<int64_t>((bytes + kBytesPerLane - 1) / kBytesPerLane, 1, kMaxLanes);
}

template <typename T>
std::string RunTyped(const RingCall& call, const CudaRank& me, DevicePath path) {
  cudaError_t err = cudaSetDevice(me.device);
  if (err != cudaSuccess) return CudaError("cudaSetDevice", err);
  if (call.ranks > kMaxDeviceRanks) {
    return "jaxring device ring: " + std::to_string(call.ranks) + " ranks; the device engine " +
           "takes at most " + std::to_string(kMaxDeviceRanks);
  }
  std::string error;
  RankSlot* slot = SlotFor(call, &error);
  if (slot == nullptr) return error;
  if (error = TakeFailure(*slot, call.rank); !error.empty()) {
    return "an earlier call of this collective failed: " + error;
  }
  if (slot->flag_block == nullptr) {
    if (error = Allocate(*slot, me.stream); !error.empty()) return error;
  }
  const bool one_shot =
      path == DevicePath::kOneShot ||
      (path == DevicePath::kAuto &&
       call.elements * static_cast<int64_t>(sizeof(T)) <= OneShotMaxBytes(call.ranks));
  ++slot->calls;
  Published& mine = slot->published[slot->calls % 2];
  mine = Published{RankBuffers{me.in, me.out, me.acc}, slot->flag_block, slot->calls};

  KernelArgs args{};
  args.plan = SchedulePlan::Make(call.mode, call.elements, call.ranks, call.rank,
                                 call.slice_elements, call.align);
  args.lanes = LanesFor<T>(call, one_shot);
  args.one_shot = one_shot;
  args.failures = slot->device_failures;
  const auto deadline = DeadlineFor(call.timeout_ms);
  args.timeout_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - Clock::now()).count());
  {
    RendezvousHandle rendezvous(call.key, call.ranks, call.rank);
    if (!rendezvous.join_error().empty()) return rendezvous.join_error();
    if (error = rendezvous->Arrive(call.rank, &mine, deadline); !error.empty()) return error;
    // Ranks agree on the epoch: the highest call count, so a rank that
    // missed calls (after an error) catches up and values keep growing.
    for (int64_t p = 0; p < call.ranks; ++p) {
      const Published& peer = *static_cast<const Published*>(rendezvous->state(p));
      args.flag_blocks[p] = peer.flag_block;
      args.buffers[p] = peer.buffers;
      args.epoch = std::max(args.epoch, peer.calls);
    }
  }
  slot->calls = args.epoch;
  err = Launch<T>(args, me.stream);
  return err == cudaSuccess ? "" : CudaError("launching the ring kernel", err);
}

bool DebugLogging() {
  static const bool on = [] {
    const char* value = std::getenv("JAXRING_LOG");
    return value != nullptr && std::strcmp(value, "debug") == 0;
  }();
  return on;
}

// The engine of one ring, decided by its first call on any rank so that all
// its ranks take the same one.
bool DeviceEngineWorks(const RingCall& call, const std::vector<int>& devices) {
  static std::mutex mu;
  static auto* decided = new std::map<std::pair<int64_t, int64_t>, bool>();
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(call.key.op_id, call.key.group);
  auto it = decided->find(key);
  if (it != decided->end()) return it->second;
  std::string why;
  if (call.ranks > kMaxDeviceRanks) why = "more than " + std::to_string(kMaxDeviceRanks) + " ranks";
  for (int a : devices) {
    for (int b : devices) {
      int can = 1;
      if (a != b) cudaDeviceCanAccessPeer(&can, a, b);
      if (!can && why.empty()) {
        why = "device " + std::to_string(a) + " cannot map device " + std::to_string(b);
      }
    }
  }
  if (DebugLogging()) {
    std::fprintf(stderr, "jaxring: ring of op %lld group %lld (%lld ranks): %s\n",
                 static_cast<long long>(call.key.op_id), static_cast<long long>(call.key.group),
                 static_cast<long long>(call.ranks),
                 why.empty() ? "device-synchronised engine"
                             : ("host-staged engine: " + why).c_str());
  }
  return decided->emplace(key, why.empty()).first->second;
}

}  // namespace

int64_t OneShotMaxBytes(int64_t ranks) {
  // Provisional, the same for every ring size, until scripts/gpu_check.sh has
  // measured the crossover per k (docs/CUDA_RING.md).
  constexpr int64_t kProvisionalOneShotMaxBytes = 256 << 10;
  return ranks > 1 ? kProvisionalOneShotMaxBytes : 0;
}

std::string RunDeviceRing(const RingCall& call, ffi::DataType type, const CudaRank& me,
                          DevicePath path) {
  switch (type) {
    case ffi::DataType::F32:
      return RunTyped<float>(call, me, path);
    case ffi::DataType::BF16:
      return RunTyped<__nv_bfloat16>(call, me, path);
    case ffi::DataType::F16:
      return RunTyped<__half>(call, me, path);
    case ffi::DataType::S32:
      return RunTyped<int32_t>(call, me, path);
    default:
      return "jaxring: unsupported dtype";
  }
}

std::string TakeDeviceFailure(const RingCall& call) {
  std::string error;
  RankSlot* slot = SlotFor(call, &error);
  return slot == nullptr ? error : TakeFailure(*slot, call.rank);
}

int64_t DeviceLanes(const RingCall& call, ffi::DataType type, bool one_shot) {
  return ElementBytes(type) == 2 ? LanesFor<__half>(call, one_shot)
                                 : LanesFor<float>(call, one_shot);
}

int DeviceRingBlocksPerSm(ffi::DataType type) {
  int blocks = 0;
  switch (type) {
    case ffi::DataType::BF16:
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, DeviceRingKernel<__nv_bfloat16>,
                                                    kThreads, 0);
      break;
    case ffi::DataType::F16:
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, DeviceRingKernel<__half>, kThreads, 0);
      break;
    case ffi::DataType::S32:
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, DeviceRingKernel<int32_t>, kThreads, 0);
      break;
    default:
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, DeviceRingKernel<float>, kThreads, 0);
  }
  return blocks;
}

std::string RunCudaCollective(const RingCall& call, ffi::DataType type, const CudaRank& me,
                              const std::vector<int>& devices) {
  static const char* engine = [] {
    const char* value = std::getenv("JAXRING_CUDA_ENGINE");
    return value == nullptr || *value == '\0' ? "host" : value;
  }();
  if (std::strcmp(engine, "host") == 0) return RunCudaRing(call, type, me);
  if (std::strcmp(engine, "device") != 0) {
    return std::string("jaxring: JAXRING_CUDA_ENGINE is '") + engine +
           "'; use 'host' (the host-staged engine, the default) or 'device' (the "
           "device-synchronised engine)";
  }
  if (!DeviceEngineWorks(call, devices)) return RunCudaRing(call, type, me);
  cudaError_t err = cudaSetDevice(me.device);
  if (err != cudaSuccess) return CudaError("cudaSetDevice", err);
  for (int peer : devices) {
    if (!PeerReadable(me.device, peer)) {
      return "jaxring device ring: peer access from device " + std::to_string(me.device) +
             " to device " + std::to_string(peer) + " could not be enabled";
    }
  }
  return RunDeviceRing(call, type, me, DevicePath::kAuto);
}

}  // namespace jaxring
