// The host-staged CUDA engine (the default; the device-synchronised one is
// device_ring.cu, engine_choice.cc chooses). GPU-resident: a rank reads its left neighbour's
// buffers over peer access (or copies them peer-to-peer into a staging slice
// where the devices cannot map each other), reduces by the call's reduction
// with 16-byte vector loads (float32 accumulation for bfloat16 and float16),
// and orders its stream after the neighbours' streams with events. The host
// thread only enqueues work.
#include <algorithm>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/ring_schedule.h"
#include "cuda/cuda_elementwise.cuh"
#include "cuda/staged_engine.h"
#include "cuda/staged_meeting.h"

namespace jaxring {
namespace {

namespace ffi = xla::ffi;

int BlocksFor(int device, int64_t work) {
  static std::mutex mu;
  static std::vector<int> sms;
  int count;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (static_cast<int>(sms.size()) <= device) sms.resize(device + 1, 0);
    if (sms[device] == 0) cudaDeviceGetAttribute(&sms[device], cudaDevAttrMultiProcessorCount, device);
    count = sms[device];
  }
  const int64_t wanted = (work + 255) / 256;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wanted, int64_t{count} * 8)));
}

template <Reduction R, typename T, typename Left, typename Dst>
cudaError_t LaunchReduce(const T* mine, const Left* left, Dst* dst, int64_t n,
                         int device, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  // Enough threads for one 16-byte pack each, or one element each where the
  // kernel falls back to scalar accesses.
  constexpr int V = 16 / sizeof(T);
  const bool vectorised = Aligned(mine, sizeof(T) * V) && Aligned(left, sizeof(Left) * V) &&
                          Aligned(dst, sizeof(Dst) * V);
  ReduceKernel<R, T, Left, Dst><<<BlocksFor(device, vectorised ? n / V + 1 : n), 256, 0, stream>>>(
      mine, left, dst, n);
  return cudaGetLastError();
}

struct RankState {
  CudaRank buffers;
  // events[0] is recorded on arrival (the inputs are ready on this stream);
  // events[i + 1] after stage i. A neighbour waiting for progress n waits on
  // events[n].
  std::vector<cudaEvent_t> events;
};

std::string CudaError(const char* what, cudaError_t err) {
  return std::string("jaxring CUDA ring: ") + what + ": " + cudaGetErrorString(err);
}

template <Reduction R, typename T, typename Acc>
cudaError_t RunStage(const Stage& st, const RankState& me, const RankState& left,
                     bool peer_readable) {
  const CudaRank& b = me.buffers;
  const CudaRank& l = left.buffers;
  const T* in = static_cast<const T*>(b.in) + st.src;
  T* out = static_cast<T*>(b.out) + st.dst;
  Acc* acc = static_cast<Acc*>(b.acc) + st.dst;
  const int64_t n = st.count;
  if (n == 0) return cudaSuccess;
  // The left neighbour's operand of this stage, fetched into staging when the
  // device cannot read the neighbour's memory directly.
  auto left_operand = [&](const auto* src) -> decltype(src) {
    if (peer_readable) return src;
    cudaMemcpyPeerAsync(b.staging, b.device, src, l.device, n * sizeof(*src), b.stream);
    return static_cast<decltype(src)>(b.staging);
  };
  const T* left_in = static_cast<const T*>(l.in) + st.src;
  const Acc* left_acc = static_cast<const Acc*>(l.acc) + st.src;
  switch (st.kind) {
    case StageKind::kSeed:
      return cudaMemcpyAsync(out, in, n * sizeof(T), cudaMemcpyDeviceToDevice, b.stream);
    case StageKind::kReduceFirst:
      return LaunchReduce<R>(in, left_operand(left_in), acc, n, b.device, b.stream);
    case StageKind::kReduce:
      return LaunchReduce<R>(in, left_operand(left_acc), acc, n, b.device, b.stream);
    case StageKind::kReduceLast:
      return st.left_is_input
                 ? LaunchReduce<R>(in, left_operand(left_in), out, n, b.device, b.stream)
                 : LaunchReduce<R>(in, left_operand(left_acc), out, n, b.device, b.stream);
    case StageKind::kCopy:
      return cudaMemcpyPeerAsync(out, b.device, static_cast<const T*>(l.out) + st.src, l.device,
                                 n * sizeof(T), b.stream);
  }
  return cudaSuccess;
}

// The CUDA work of WalkSchedule: each stage is ordered after the neighbours'
// events it needs, and records an event of its own when enqueued.
template <Reduction R, typename T, typename Acc>
struct CudaSteps {
  const std::vector<Stage>& stages;
  const RankState& me;
  const RankState& left;
  const RankState& right;
  const bool peer_readable = PeerReadable(me.buffers.device, left.buffers.device);

  void AfterLeft(int64_t count) { cudaStreamWaitEvent(me.buffers.stream, left.events[count], 0); }
  void AfterRight(int64_t count) { cudaStreamWaitEvent(me.buffers.stream, right.events[count], 0); }
  std::string Run(size_t i) {
    cudaError_t err = RunStage<R, T, Acc>(stages[i], me, left, peer_readable);
    if (err == cudaSuccess) err = cudaEventRecord(me.events[i + 1], me.buffers.stream);
    return err == cudaSuccess ? "" : CudaError("enqueueing a ring stage", err);
  }
};

template <Reduction R, typename T>
std::string RunTyped(const RingCall& call, const CudaRank& buffers) {
  using Acc = typename AccumulatorOf<T>::type;
  cudaError_t err = cudaSetDevice(buffers.device);
  if (err != cudaSuccess) return CudaError("cudaSetDevice", err);
  const auto stages = BuildSchedule(call.mode, call.elements, call.ranks, call.rank,
                                    call.slice_elements, call.align);
  if (call.ranks == 1) {  // a ring of one: the schedule is a single copy
    for (const Stage& st : stages) {
      err = cudaMemcpyAsync(static_cast<T*>(buffers.out) + st.dst,
                            static_cast<const T*>(buffers.in) + st.src, st.count * sizeof(T),
                            cudaMemcpyDeviceToDevice, buffers.stream);
      if (err != cudaSuccess) return CudaError("cudaMemcpyAsync", err);
    }
    return "";
  }
  RankState me{buffers, std::vector<cudaEvent_t>(stages.size() + 1)};
  for (auto& event : me.events) {
    err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (err != cudaSuccess) return CudaError("cudaEventCreate", err);
  }
  std::string error;
  {
    StagedMeeting meeting(call.key, call.ranks, call.rank);
    const auto deadline = DeadlineFor(call.timeout_ms);
    err = cudaEventRecord(me.events[0], buffers.stream);
    error = err != cudaSuccess ? CudaError("cudaEventRecord", err) : meeting.Arrive(&me, deadline);
    if (error.empty()) {
      const int64_t left = Mod(call.rank - 1, call.ranks), right = Mod(call.rank + 1, call.ranks);
      CudaSteps<R, T, Acc> steps{stages, me, *static_cast<const RankState*>(meeting.state(left)),
                              *static_cast<const RankState*>(meeting.state(right))};
      error = WalkSchedule(meeting, stages, left, right, deadline, steps);
    }
  }
  // An event destroyed while pending is released once it completes.
  for (auto& event : me.events) cudaEventDestroy(event);
  return error;
}

}  // namespace

// Peer access is enabled once per ordered pair of devices; where it cannot
// be, reads go through cudaMemcpyPeerAsync into the staging slice.
bool PeerReadable(int device, int peer) {
  if (device == peer) return true;
  static std::mutex mu;
  static std::set<std::pair<int, int>> readable, unreadable;
  std::lock_guard<std::mutex> lock(mu);
  if (readable.count({device, peer})) return true;
  if (unreadable.count({device, peer})) return false;
  int can = 0;
  cudaDeviceCanAccessPeer(&can, device, peer);
  if (can) {
    cudaError_t err = cudaDeviceEnablePeerAccess(peer, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
    else if (err != cudaSuccess) can = 0;
  }
  (can ? readable : unreadable).insert({device, peer});
  return can;
}

std::string RunCudaRing(const RingCall& call, const CudaRank& me) {
  std::string error;
  const bool known = EngineTypes::Visit(call.element_type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    switch (call.reduction) {
      case Reduction::kSum:
        error = RunTyped<Reduction::kSum, T>(call, me);
        break;
      case Reduction::kMax:
        error = RunTyped<Reduction::kMax, T>(call, me);
        break;
      case Reduction::kMin:
        error = RunTyped<Reduction::kMin, T>(call, me);
        break;
      default:
        error = "jaxring: unknown reduction " + std::to_string(static_cast<int>(call.reduction));
    }
  });
  return known ? error : "jaxring: unsupported dtype";
}

}  // namespace jaxring
