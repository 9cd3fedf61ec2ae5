#include "testing/ring_harness.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "core/ring_handler_common.h"
#include "core/ring_protocol.h"
#include "cuda/cuda_elementwise.cuh"
#include "cuda/device_ring.h"
#include "cuda/staged_engine.h"

namespace jaxring {
namespace {

namespace ffi = xla::ffi;

constexpr int kDevice = 0;  // every virtual rank shares the first GPU

void Check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("jaxring harness: ") + what + ": " +
                             cudaGetErrorString(err));
  }
}

// Harness op ids lie far above any the Python side hands out (jaxring/collectives/_ring_call.py
// counts from 1), so their rings never share flags with real collectives.
// Correctness runs of k ranks all use one ring, whatever their shape: the
// flags must serve call after call with nothing reset, as under XLA.
int64_t CheckOpId(int64_t ranks) { return (int64_t{1} << 40) + ranks; }
// Each timing run gets a ring of its own, so its first call's allocation
// happens in its warm-up.
int64_t NextTimingOpId() {
  static std::atomic<int64_t> next{int64_t{1} << 41};
  return next++;
}

int64_t InElements(const HarnessCase& c) {
  return TraitsOf(static_cast<Mode>(c.mode)).input_is_chunk() ? c.elements / c.ranks : c.elements;
}
int64_t OutElements(const HarnessCase& c) {
  return TraitsOf(static_cast<Mode>(c.mode)).output_is_chunk() ? c.elements / c.ranks : c.elements;
}
// XLA's workspace for this case (ring_handler_common.h), as the handler gets it.
WorkspaceLayout LayoutOf(const HarnessCase& c) {
  return WorkspaceFor(static_cast<Mode>(c.mode), c.type, c.elements, c.slice_bytes,
                      /*staging_slice=*/true);
}

RingCall CallOf(const HarnessCase& c, int64_t op_id, int64_t rank, int64_t run_id = 1) {
  return MakeRingCall(CallKey{run_id, op_id, 0}, static_cast<Mode>(c.mode), c.elements, c.ranks,
                      rank, static_cast<int64_t>(c.timeout_s * 1000), c.slice_bytes, c.type,
                      c.reduction);
}

// Bytes of one element of the case's buffers (a complex number's two components).
int64_t BufferBytes(const HarnessCase& c) { return xla::ffi::ByteWidth(c.type); }

DevicePath PathOf(const std::string& path) {
  if (path == "auto") return DevicePath::kAuto;
  if (path == "ring") return DevicePath::kRing;
  if (path == "one_shot") return DevicePath::kOneShot;
  throw std::invalid_argument("path must be 'auto', 'ring' or 'one_shot', got '" + path + "'");
}

bool TakesOneShot(const HarnessCase& c) {
  const DevicePath path = PathOf(c.path);
  return path == DevicePath::kOneShot ||
         (path == DevicePath::kAuto &&
          c.elements * BufferBytes(c) <= OneShotMaxBytes(c.ranks));
}

// k kernels spinning on each other from k streams run only if the GPU runs
// them at once: enough hardware queues and room for every block.
void CheckCoResidency(const HarnessCase& c) {
  if (c.engine == "host") return;
  if (c.engine != "device") {
    throw std::invalid_argument("engine must be 'host' or 'device', got '" + c.engine + "'");
  }
  const char* value = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  const int connections = value == nullptr ? 8 : std::atoi(value);
  if (connections < c.ranks) {
    throw std::invalid_argument(
        std::to_string(c.ranks) + " virtual ranks need as many hardware queues: set "
        "CUDA_DEVICE_MAX_CONNECTIONS >= " + std::to_string(c.ranks) +
        " in the environment before CUDA starts (scripts/gpu/gpu_check.sh sets 32)");
  }
  const HarnessDevice device = HarnessDeviceInfo();
  const RingCall call = CallOf(c, 0, 0);
  const int64_t lanes = DeviceLanes(call, TakesOneShot(c));
  const int ring_blocks = DeviceRingBlocksPerSm(call.element_type);
  if (c.ranks * lanes > int64_t{device.sms} * ring_blocks) {
    throw std::invalid_argument(
        std::to_string(c.ranks) + " ranks x " + std::to_string(lanes) + " blocks do not fit at " +
        "once on " + std::to_string(device.sms) + " SMs x " + std::to_string(ring_blocks) +
        " blocks: the ranks would wait on ranks that cannot start");
  }
}

// Small values: eighths from -1 to 1 for the float types (so that sums stay
// exact), -8 to 8 for the integers (wrapped for the unsigned ones).
template <typename T>
__global__ void FillKernel(T* data, int64_t n, uint32_t seed) {
  using Acc = typename AccumulatorOf<T>::type;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int32_t small = static_cast<int32_t>((static_cast<uint32_t>(i) * 2654435761u + seed) % 17) - 8;
    Store(std::is_integral_v<Acc> ? static_cast<Acc>(small) : static_cast<Acc>(small * 0.125f), data + i);
  }
}

// `n` components of `type` (an engine type: a RingCall's element_type).
void Fill(ffi::DataType type, void* data, int64_t n, uint32_t seed) {
  if (n == 0) return;
  EngineTypes::Visit(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    FillKernel<<<256, 256>>>(static_cast<T*>(data), n, seed);
  });
  Check(cudaGetLastError(), "filling a buffer");
}

// One rank's device buffers, laid out as XLA lays out the handler's
// operands: input, output, workspace [partial sums | staging slice].
struct RankMemory {
  void* in = nullptr;
  void* out = nullptr;
  void* workspace = nullptr;
  CudaRank Rank(const HarnessCase& c, const RingCall& call, cudaStream_t stream) const {
    const WorkspaceLayout layout = LayoutOf(c);
    char* ws = static_cast<char*>(workspace);
    return CudaRank{in, out, layout.partial_sums > 0 ? ws : out, ws + layout.staging_offset_bytes(),
                    kDevice, stream};
  }
};

class Buffers {
 public:
  Buffers(const HarnessCase& c, int sets) : c_(c) {
    const int64_t bytes = BufferBytes(c);
    const WorkspaceLayout layout = LayoutOf(c);
    for (int64_t i = 0; i < c.ranks * sets; ++i) {
      RankMemory m;
      Check(cudaMalloc(&m.in, std::max<int64_t>(InElements(c) * bytes, 16)), "cudaMalloc input");
      Check(cudaMalloc(&m.out, std::max<int64_t>(OutElements(c) * bytes, 16)), "cudaMalloc output");
      Check(cudaMalloc(&m.workspace, layout.total() * layout.element_bytes), "cudaMalloc workspace");
      memory_.push_back(m);
    }
  }
  ~Buffers() {
    for (RankMemory& m : memory_) {
      cudaFree(m.in);
      cudaFree(m.out);
      cudaFree(m.workspace);
    }
  }
  const RankMemory& At(int64_t set, int64_t rank) const { return memory_[set * c_.ranks + rank]; }

 private:
  HarnessCase c_;
  std::vector<RankMemory> memory_;
};

// Every virtual rank lives on the one device.
std::vector<int> RingDevices(const HarnessCase& c) { return std::vector<int>(c.ranks, kDevice); }

std::string RunEngine(const HarnessCase& c, const RingCall& call, const CudaRank& me) {
  if (c.engine == "host") return RunCudaRing(call, me);
  return RunDeviceRing(call, me, RingDevices(c), PathOf(c.path));
}

std::vector<cudaStream_t> Streams(int64_t n) {
  std::vector<cudaStream_t> streams(n);
  for (auto& s : streams) Check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  return streams;
}

}  // namespace

std::vector<std::string> HarnessRun(const HarnessCase& c, const void* inputs, void* outputs) {
  Check(cudaSetDevice(kDevice), "cudaSetDevice");
  CheckCoResidency(c);
  const int64_t bytes = BufferBytes(c);
  Buffers buffers(c, 1);
  for (int64_t r = 0; r < c.ranks; ++r) {
    const RankMemory& m = buffers.At(0, r);
    Check(cudaMemcpy(m.in, static_cast<const char*>(inputs) + r * InElements(c) * bytes,
                     InElements(c) * bytes, cudaMemcpyHostToDevice), "copying an input");
    Check(cudaMemset(m.out, 0xff, OutElements(c) * bytes), "poisoning an output");
    const WorkspaceLayout layout = LayoutOf(c);
    Check(cudaMemset(m.workspace, 0xff, layout.partial_sums * layout.element_bytes), "poisoning partial sums");
  }
  Check(cudaDeviceSynchronize(), "preparing the buffers");
  std::vector<cudaStream_t> streams = Streams(c.ranks);
  std::vector<std::string> errors(c.ranks);
  const int64_t op_id = CheckOpId(c.ranks);
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < c.ranks; ++r) {
    threads.emplace_back([&, r] {
      cudaSetDevice(kDevice);
      const RingCall call = CallOf(c, op_id, r);
      errors[r] = RunEngine(c, call, buffers.At(0, r).Rank(c, call, streams[r]));
      const cudaError_t err = cudaStreamSynchronize(streams[r]);
      if (errors[r].empty() && err != cudaSuccess) errors[r] = cudaGetErrorString(err);
      if (errors[r].empty() && c.engine == "device") errors[r] = TakeDeviceFailure(call, RingDevices(c));
    });
  }
  for (auto& t : threads) t.join();
  for (int64_t r = 0; r < c.ranks; ++r) {
    Check(cudaMemcpy(static_cast<char*>(outputs) + r * OutElements(c) * bytes, buffers.At(0, r).out,
                     OutElements(c) * bytes, cudaMemcpyDeviceToHost), "copying an output");
    cudaStreamDestroy(streams[r]);
  }
  return errors;
}

std::vector<std::string> HarnessQueue(const HarnessCase& c, int64_t steps, const void* inputs,
                                      void* outputs) {
  Check(cudaSetDevice(kDevice), "cudaSetDevice");
  CheckCoResidency(c);
  const int64_t bytes = BufferBytes(c);
  const int64_t in_bytes = InElements(c) * bytes, out_bytes = OutElements(c) * bytes;
  Buffers buffers(c, static_cast<int>(steps));
  for (int64_t step = 0; step < steps; ++step) {
    for (int64_t r = 0; r < c.ranks; ++r) {
      const RankMemory& m = buffers.At(step, r);
      Check(cudaMemcpy(m.in, static_cast<const char*>(inputs) + (step * c.ranks + r) * in_bytes, in_bytes,
                       cudaMemcpyHostToDevice), "copying an input");
      Check(cudaMemset(m.out, 0xff, out_bytes), "poisoning an output");
    }
  }
  Check(cudaDeviceSynchronize(), "preparing the buffers");
  std::vector<cudaStream_t> streams = Streams(c.ranks);
  std::vector<std::string> errors(c.ranks);
  // A ring of its own, and run ids no other harness call uses: each step is
  // an execution of its own, as XLA numbers them.
  const int64_t op_id = NextTimingOpId();
  static std::atomic<int64_t> next_run_id{int64_t{1} << 40};
  const int64_t first_run = next_run_id.fetch_add(steps);
  // A rank that fails stops every rank, so a broken engine costs one timeout, not one per step.
  std::atomic<bool> any_failed{false};
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < c.ranks; ++r) {
    threads.emplace_back([&, r] {
      cudaSetDevice(kDevice);
      for (int64_t step = 0; step < steps && !any_failed.load(); ++step) {
        const RingCall call = CallOf(c, op_id, r, first_run + step);
        errors[r] = RunEngine(c, call, buffers.At(step, r).Rank(c, call, streams[r]));
        if (!errors[r].empty()) any_failed.store(true);
      }
      const cudaError_t err = cudaStreamSynchronize(streams[r]);
      if (errors[r].empty() && err != cudaSuccess) errors[r] = cudaGetErrorString(err);
      if (errors[r].empty() && c.engine == "device") {
        errors[r] = TakeDeviceFailure(CallOf(c, op_id, r), RingDevices(c));
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int64_t step = 0; step < steps; ++step) {
    for (int64_t r = 0; r < c.ranks; ++r) {
      Check(cudaMemcpy(static_cast<char*>(outputs) + (step * c.ranks + r) * out_bytes, buffers.At(step, r).out,
                       out_bytes, cudaMemcpyDeviceToHost), "copying an output");
    }
  }
  for (auto& s : streams) cudaStreamDestroy(s);
  return errors;
}

namespace {

__global__ void EmptyKernel() {}

// k rank threads, each on its own stream, run `run(rank, call)` (what one rank
// enqueues for one call) `warmup` times, meet, then `calls` times between CUDA
// events: per call the first start to the last end over the streams, and the
// wall time of all calls. `finish(rank)` runs on each rank's thread after its
// stream drained. Throws the first rank's error.
template <typename Run, typename Finish>
HarnessTimes TimeRanks(int64_t ranks, int calls, int warmup, const std::vector<cudaStream_t>& streams,
                       Run run, Finish finish) {
  std::vector<cudaEvent_t> starts(ranks * calls), ends(ranks * calls);
  for (auto* events : {&starts, &ends}) {
    for (auto& e : *events) Check(cudaEventCreate(&e), "cudaEventCreate");
  }
  std::vector<std::string> errors(ranks);
  std::mutex mu;
  std::condition_variable changed;
  int64_t ready = 0, finished = 0;
  bool go = false;
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      cudaSetDevice(kDevice);
      for (int i = 0; i < warmup; ++i) {
        if (errors[r].empty()) errors[r] = run(r, i);
      }
      cudaStreamSynchronize(streams[r]);
      {
        std::unique_lock<std::mutex> lock(mu);
        ++ready;
        changed.notify_all();
        changed.wait(lock, [&] { return go; });
      }
      for (int i = 0; i < calls; ++i) {
        cudaEventRecord(starts[r * calls + i], streams[r]);
        if (errors[r].empty()) errors[r] = run(r, i);
        cudaEventRecord(ends[r * calls + i], streams[r]);
      }
      cudaStreamSynchronize(streams[r]);
      if (errors[r].empty()) errors[r] = finish(r);
      std::lock_guard<std::mutex> lock(mu);
      ++finished;
      changed.notify_all();
    });
  }
  std::chrono::steady_clock::time_point begin, end;
  {
    std::unique_lock<std::mutex> lock(mu);
    changed.wait(lock, [&] { return ready == ranks; });
    begin = std::chrono::steady_clock::now();
    go = true;
    changed.notify_all();
    changed.wait(lock, [&] { return finished == ranks; });
    end = std::chrono::steady_clock::now();
  }
  for (auto& t : threads) t.join();
  for (const std::string& e : errors) {
    if (!e.empty()) throw std::runtime_error(e);
  }
  HarnessTimes times;
  times.host_us_per_call = std::chrono::duration<double, std::micro>(end - begin).count() / calls;
  for (int i = 0; i < calls; ++i) {
    float first = 0, last = 0;
    for (int64_t r = 0; r < ranks; ++r) {
      float start_ms = 0, end_ms = 0;
      Check(cudaEventElapsedTime(&start_ms, starts[0], starts[r * calls + i]), "cudaEventElapsedTime");
      Check(cudaEventElapsedTime(&end_ms, starts[0], ends[r * calls + i]), "cudaEventElapsedTime");
      first = r == 0 ? start_ms : std::min(first, start_ms);
      last = r == 0 ? end_ms : std::max(last, end_ms);
    }
    times.device_us.push_back((last - first) * 1000.0);
  }
  for (auto* events : {&starts, &ends}) {
    for (auto& e : *events) cudaEventDestroy(e);
  }
  return times;
}

}  // namespace

HarnessTimes HarnessTime(const HarnessCase& c, int calls, int warmup, int rotate) {
  Check(cudaSetDevice(kDevice), "cudaSetDevice");
  CheckCoResidency(c);
  rotate = std::max(rotate, 1);
  Buffers buffers(c, rotate);
  for (int s = 0; s < rotate; ++s) {
    for (int64_t r = 0; r < c.ranks; ++r) {
      Fill(FindElementType(c.type)->component, buffers.At(s, r).in,
           InElements(c) * ComponentsPerElement(c.type), s * 131 + r);
    }
  }
  Check(cudaDeviceSynchronize(), "preparing the buffers");
  std::vector<cudaStream_t> streams = Streams(c.ranks);
  const int64_t op_id = NextTimingOpId();
  std::vector<RingCall> rank_calls;
  for (int64_t r = 0; r < c.ranks; ++r) rank_calls.push_back(CallOf(c, op_id, r));
  HarnessTimes times = TimeRanks(
      c.ranks, calls, warmup, streams,
      [&](int64_t r, int i) {
        return RunEngine(c, rank_calls[r], buffers.At(i % rotate, r).Rank(c, rank_calls[r], streams[r]));
      },
      [&](int64_t r) {
        return c.engine == "device" ? TakeDeviceFailure(rank_calls[r], RingDevices(c)) : std::string();
      });
  times.one_shot = c.engine == "device" && TakesOneShot(c);
  times.lanes = c.engine == "device" ? DeviceLanes(CallOf(c, 0, 0), times.one_shot) : 0;
  for (auto& s : streams) cudaStreamDestroy(s);
  return times;
}

HarnessTimes HarnessLaunchFloor(int64_t ranks, int calls, int warmup) {
  Check(cudaSetDevice(kDevice), "cudaSetDevice");
  std::vector<cudaStream_t> streams = Streams(ranks);
  HarnessTimes times = TimeRanks(
      ranks, calls, warmup, streams,
      [&](int64_t r, int) {
        EmptyKernel<<<1, 1, 0, streams[r]>>>();
        const cudaError_t err = cudaGetLastError();
        return err == cudaSuccess ? std::string() : std::string("EmptyKernel: ") + cudaGetErrorString(err);
      },
      [](int64_t) { return std::string(); });
  times.one_shot = false;
  times.lanes = 0;
  for (auto& s : streams) cudaStreamDestroy(s);
  return times;
}

namespace {

// Device-side microseconds of each of `calls` runs of `enqueue` on the
// default stream, after one warm-up run.
template <typename Enqueue>
std::vector<double> TimeOnDevice(int calls, Enqueue enqueue) {
  cudaEvent_t start, stop;
  Check(cudaEventCreate(&start), "cudaEventCreate");
  Check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<double> times;
  for (int i = 0; i < calls + 1; ++i) {
    cudaEventRecord(start);
    enqueue();
    cudaEventRecord(stop);
    Check(cudaEventSynchronize(stop), "timing on the device");
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (i > 0) times.push_back(ms * 1000.0);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return times;
}

// The host-staged engine's reduce kernel over a whole buffer, launched as
// that engine launches it for a large stage (8 blocks of 256 per SM).
template <typename T>
std::vector<double> ReduceTimes(int64_t elements, int calls) {
  T *a = nullptr, *b = nullptr, *dst = nullptr;
  for (T** p : {&a, &b, &dst}) Check(cudaMalloc(p, elements * sizeof(T)), "cudaMalloc");
  Fill(ffi::DataType::F32, a, elements * sizeof(T) / 4, 1);  // any finite bits
  Fill(ffi::DataType::F32, b, elements * sizeof(T) / 4, 2);
  const int blocks = HarnessDeviceInfo().sms * 8;
  auto times = TimeOnDevice(calls, [&] {
    ReduceKernel<Reduction::kSum, T, T, T><<<blocks, 256>>>(a, b, dst, elements);
  });
  for (T* p : {a, b, dst}) cudaFree(p);
  return times;
}

}  // namespace

std::vector<double> HarnessCopyTimesUs(int64_t bytes, int calls) {
  Check(cudaSetDevice(kDevice), "cudaSetDevice");
  void *src = nullptr, *dst = nullptr;
  Check(cudaMalloc(&src, bytes), "cudaMalloc");
  Check(cudaMalloc(&dst, bytes), "cudaMalloc");
  auto times = TimeOnDevice(calls, [&] { cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice); });
  cudaFree(src);
  cudaFree(dst);
  return times;
}

std::vector<double> HarnessReduceTimesUs(ffi::DataType type, int64_t elements, int calls) {
  Check(cudaSetDevice(kDevice), "cudaSetDevice");
  std::vector<double> times;
  EngineTypes::Visit(type, [&](auto tag) { times = ReduceTimes<typename decltype(tag)::type>(elements, calls); });
  return times;
}

namespace {

template <Reduction R, typename T>
void CombineOnHost(const T* a, const T* b, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) Store(Combine<R>(ToAcc(a[i]), ToAcc(b[i])), out + i);
}

}  // namespace

void HarnessCombineOnHost(ffi::DataType type, Reduction reduction, const void* a, const void* b,
                          void* out, int64_t n) {
  const bool known = EngineTypes::Visit(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto* x = static_cast<const T*>(a);
    const auto* y = static_cast<const T*>(b);
    auto* z = static_cast<T*>(out);
    switch (reduction) {
      case Reduction::kSum:
        return CombineOnHost<Reduction::kSum>(x, y, z, n);
      case Reduction::kMax:
        return CombineOnHost<Reduction::kMax>(x, y, z, n);
      case Reduction::kMin:
        return CombineOnHost<Reduction::kMin>(x, y, z, n);
    }
  });
  if (!known) throw std::invalid_argument("not a type of the CUDA engines");
}

HarnessDevice HarnessDeviceInfo() {
  cudaDeviceProp prop;
  Check(cudaGetDeviceProperties(&prop, kDevice), "cudaGetDeviceProperties");
  return HarnessDevice{prop.name, prop.multiProcessorCount, prop.major * 10 + prop.minor,
                       DeviceRingBlocksPerSm(ffi::DataType::F32), kMaxLanes};
}

}  // namespace jaxring
