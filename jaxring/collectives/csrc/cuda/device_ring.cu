// The device-synchronised CUDA ring engine on the CUDA runtime: the kernel
// that runs ring_protocol.h with GPU primitives, and the CUDA seam under its
// host side (device_engine.h), which meets the other ranks once per call and
// launches it.
//
// Memory ordering (the PTX memory model, sm_70 and later). A lane publishes
// after __syncthreads(), so every thread's loads and stores of the lane's
// data so far happen before thread 0's st.release.sys of the flag; a waiter's
// thread 0 reads the flag with ld.acquire.sys and releases the block's other
// threads with a barrier after it. System scope because the flags and data
// cross GPUs over peer mappings; on one GPU it is merely stronger than needed.
#include "cuda/device_ring.h"

#include <cuda.h>

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
#include <type_traits>
#include <vector>

#include "core/ring_protocol.h"
#include "core/timeout.h"
#include "cuda/cuda_elementwise.cuh"
#include "cuda/engine_choice.h"
#include "cuda/staged_engine.h"

namespace jaxring {
namespace {

namespace ffi = xla::ffi;

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

// ring_protocol.h's primitives for one block: after a barrier, thread i
// stores flag i (the one-shot path's k stores go out at once, not one after
// another from thread 0); thread 0 waits for one flag, thread i for flag i
// of many (WaitEvery), and a barrier orders every thread's data accesses
// after the waits.
struct DeviceSync {
  using Word = uint64_t;
  uint64_t deadline_ns;

  __device__ void Publish(Word* const* words, int count, uint64_t value) {
    __syncthreads();
    for (int i = threadIdx.x; i < count; i += blockDim.x) StoreRelease(words[i], value);
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

  // Thread i waits for words i, i + blockDim.x, ...: the one-shot path's k
  // waits at once. The caller's barriers keep `late` from being reset while
  // a thread still reads it (a Publish lies between any two WaitEvery).
  __device__ bool WaitEvery(const Word* first, int64_t stride, int count, uint64_t value,
                            int64_t* which, uint64_t* seen) {
    __shared__ int late;  // the lowest index that timed out; count if none
    if (threadIdx.x == 0) late = count;
    __syncthreads();
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
      const Word* word = first + i * stride;
      while (LoadAcquire(word) < value) {
        if (GlobalTimerNs() > deadline_ns) {
          atomicMin(&late, i);
          break;
        }
        __nanosleep(100);
      }
    }
    __syncthreads();
    if (late == count) return true;
    if (threadIdx.x == 0) {
      *which = late;
      *seen = LoadAcquire(first + late * stride);
    }
    return false;
  }
};

// What a timed-out call leaves in its output, so that XLA never hands on a
// half-written result as if it were right: NaN for the float types, the
// most negative value for signed integers, the largest for unsigned ones
// (docs/CUDA_RING.md).
template <typename T>
__device__ __forceinline__ void PoisonValue(T* v) {
  static_assert(std::is_integral_v<T>);
  using U = std::make_unsigned_t<T>;
  *v = static_cast<T>(std::is_signed_v<T> ? U{1} << (8 * sizeof(T) - 1) : ~U{0});
}
__device__ __forceinline__ void PoisonValue(float* v) { *v = __int_as_float(0x7fc00000); }
__device__ __forceinline__ void PoisonValue(double* v) { *v = __longlong_as_double(0x7ff8000000000000); }
__device__ __forceinline__ void PoisonValue(__half* v) { *v = __ushort_as_half(0x7e00); }
__device__ __forceinline__ void PoisonValue(__nv_bfloat16* v) { *v = __ushort_as_bfloat16(0x7fc0); }

// Run by every block of a rank's kernel at its end: the last block to finish
// (a counter in the rank's flag block that only grows) poisons the rank's
// whole output if any lane of this call gave up, then tells the host that the
// call is over (the engine reuses its flags for a later execution only then).
template <typename T>
__device__ void FinishCall(const KernelArgs& args) {
  __shared__ int last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(reinterpret_cast<unsigned long long*>(args.blocks_done), 1ull) + 1 ==
           args.blocks_done_after;
  }
  __syncthreads();
  if (!last) return;
  int failed = 0;
  if (threadIdx.x == 0) {
    __threadfence();
    for (int64_t lane = 0; lane < args.lanes; ++lane) {
      failed |= static_cast<volatile LaneFailureRecord*>(args.failures)[lane].call == args.call_tag;
    }
  }
  if (__syncthreads_or(failed)) {
    const SchedulePlan& plan = args.plan;
    const int64_t n = plan.OutputElements();
    T* out = static_cast<T*>(args.buffers[plan.rank].out);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) PoisonValue(out + i);
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    __threadfence_system();
    StoreRelease(args.finished, args.epoch);
  }
}

// One block per lane. Bounded registers (256 threads, two blocks per SM:
// at most 128 registers; -Xptxas=-v shows the spills, docs/CUDA_RING.md) and
// bounded blocks (kMaxLanes) per rank let the ranks sharing a GPU be
// co-resident (docs/CUDA_RING.md).
template <typename T, KernelReductions K>
__global__ void __launch_bounds__(kThreads, 2) DeviceRingKernel(const KernelArgs args) {
  using Acc = typename AccumulatorOf<T>::type;
  DeviceSync sync{GlobalTimerNs() + args.timeout_ns};
  BlockElementwise<K> ew{args.reduction};
  const LaneCall<uint64_t> call{args.plan.ranks(), args.plan.rank, args.lanes, blockIdx.x,
                                args.epoch, args.flag_blocks, args.buffers};
  const LaneOutcome outcome =
      args.one_shot ? RunShotLane<T>(Shot::kOneShot, args.plan, call, sync, ew)
                    : RunRingLane<T, Acc>(args.plan, call, sync, ew);
  if (!outcome.ok && threadIdx.x == 0) {
    volatile LaneFailureRecord* record = args.failures + blockIdx.x;
    record->peer = outcome.peer;
    record->wanted = outcome.wanted;
    record->seen = outcome.seen;
    __threadfence_system();
    record->call = args.call_tag;
  }
  FinishCall<T>(args);
}

using RingKernel = void (*)(KernelArgs);

// The kernel of the device ring for `reduction` over elements of T.
template <typename T>
RingKernel KernelFor(Reduction reduction) {
  return reduction == Reduction::kSum ? DeviceRingKernel<T, KernelReductions::kSum>
                                      : DeviceRingKernel<T, KernelReductions::kMaxMin>;
}

// --- host side: the CUDA runtime behind device_engine.h's seam ------------

std::string CudaError(const char* what, cudaError_t err) {
  return std::string(what) + ": " + cudaGetErrorString(err);
}

// A driver API function, found through the runtime (no link to libcuda).
template <typename Fn>
Fn DriverFunction(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status;
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &status) != cudaSuccess ||
      status != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return reinterpret_cast<Fn>(fn);
}

class CudaRuntimeSeam : public CudaSeam {
 public:
  int DeviceCount() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) cudaGetLastError();
    return count;
  }

  // Asking for a kernel's attributes loads its module on the current device:
  // both kernels of every type (the sum's, and max and min's).
  std::string LoadKernels(int device) override {
    cudaError_t err = cudaSetDevice(device);
    EngineTypes::VisitEvery([&](auto tag) {
      for (const Reduction reduction : {Reduction::kSum, Reduction::kMax}) {
        cudaFuncAttributes attributes;
        if (err == cudaSuccess) {
          err = cudaFuncGetAttributes(&attributes, KernelFor<typename decltype(tag)::type>(reduction));
        }
      }
    });
    return err == cudaSuccess ? "" : CudaError("loading the ring kernels", err);
  }

  std::string AllocZeroedDevice(int device, size_t bytes, void** ptr) override {
    cudaError_t err = cudaSetDevice(device);
    if (err == cudaSuccess) err = cudaMalloc(ptr, bytes);
    if (err == cudaSuccess) err = cudaMemset(*ptr, 0, bytes);
    if (err == cudaSuccess) err = cudaDeviceSynchronize();
    return err == cudaSuccess ? "" : CudaError("allocating the flag pool", err);
  }

  std::string AllocMappedHost(size_t bytes, void** host, void** device_view) override {
    cudaError_t err = cudaHostAlloc(host, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
    if (err == cudaSuccess) {
      std::memset(*host, 0, bytes);
      err = cudaHostGetDevicePointer(device_view, *host, 0);
    }
    return err == cudaSuccess ? "" : CudaError("allocating the failure records", err);
  }

  // NVLink-class: peer access with native atomics, which PCIe peer links lack.
  PeerLink Link(int device, int peer) override {
    int can = 0, atomics = 0;
    if (cudaDeviceCanAccessPeer(&can, device, peer) != cudaSuccess) cudaGetLastError();
    if (!can) return PeerLink::kNone;
    if (cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, device, peer) !=
        cudaSuccess) {
      cudaGetLastError();
    }
    return atomics ? PeerLink::kNvlink : PeerLink::kPcie;
  }

  std::string EnablePeerAccess(int device, int peer) override {
    cudaError_t err = cudaSetDevice(device);
    if (err == cudaSuccess) err = cudaDeviceEnablePeerAccess(peer, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
      cudaGetLastError();
      err = cudaSuccess;
    }
    return err == cudaSuccess ? "" : CudaError("enabling peer access", err);
  }

  // Peer access covers cudaMalloc memory; memory of a cudaMallocAsync pool or
  // a VMM mapping is readable by a peer only if its pool or mapping says so.
  std::string PeerCanRead(const void* ptr, int peer) override {
    static const auto get_attribute =
        DriverFunction<CUresult (*)(void*, CUpointer_attribute, CUdeviceptr)>("cuPointerGetAttribute");
    static const auto pool_access =
        DriverFunction<CUresult (*)(CUmemAccess_flags*, CUmemoryPool, CUmemLocation*)>("cuMemPoolGetAccess");
    static const auto mapping_access =
        DriverFunction<CUresult (*)(unsigned long long*, const CUmemLocation*, CUdeviceptr)>("cuMemGetAccess");
    if (get_attribute == nullptr || pool_access == nullptr || mapping_access == nullptr) {
      return "the CUDA driver does not offer the pointer queries";
    }
    const auto address = reinterpret_cast<CUdeviceptr>(ptr);
    CUmemLocation location{};
    location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    location.id = peer;
    CUmemoryPool pool = nullptr;
    if (get_attribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, address) == CUDA_SUCCESS &&
        pool != nullptr) {
      CUmemAccess_flags flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
      if (pool_access(&flags, pool, &location) != CUDA_SUCCESS ||
          flags == CU_MEM_ACCESS_FLAGS_PROT_NONE) {
        return "it comes from a cudaMallocAsync pool that does not grant the peer access";
      }
      return "";
    }
    unsigned long long flags = 0;
    if (mapping_access(&flags, &location, address) == CUDA_SUCCESS &&
        flags == CU_MEM_ACCESS_FLAGS_PROT_NONE) {
      return "it is a virtual-memory mapping that does not grant the peer access";
    }
    return "";  // cudaMalloc memory (cuMemGetAccess refuses it): peer access covers it
  }

  std::string Launch(ffi::DataType type, const KernelArgs& args, void* stream) override {
    cudaError_t err = cudaSuccess;
    const bool known = EngineTypes::Visit(type, [&](auto tag) {
      KernelFor<typename decltype(tag)::type>(args.reduction)
          <<<static_cast<unsigned>(args.lanes), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(args);
      err = cudaGetLastError();
    });
    if (!known) return "jaxring: unsupported dtype";
    return err == cudaSuccess ? "" : CudaError("jaxring device ring: launching the ring kernel", err);
  }
};

bool DebugLogging() {
  static const bool on = [] {
    const char* value = std::getenv("JAXRING_LOG");
    return value != nullptr && std::strcmp(value, "debug") == 0;
  }();
  return on;
}

// The process's engine. Pool: a flag block per (collective op, rank) on each
// device, 2 KiB each; the virtual-rank harness makes a ring per case.
DeviceEngine& Engine() {
  static auto* seam = new CudaRuntimeSeam();
  static auto* engine = new DeviceEngine(seam, [] {
    EngineOptions options;
    options.any_link = EngineName() == "device-any-link";
    options.pool_slots = 16384;
    options.one_shot_max_bytes = OneShotMaxBytes;
    options.log = [](const std::string& line) {
      static std::atomic<bool> first{true};
      if (first.exchange(false) || DebugLogging()) {
        std::fprintf(stderr, "%s%s\n", line.c_str(),
                     DebugLogging() ? "" : " (JAXRING_LOG=debug logs every ring)");
      }
    };
    return options;
  }());
  return *engine;
}

}  // namespace

int64_t OneShotMaxBytes(int64_t ranks) {
  // The largest size at which one-shot beat the ring, virtual ranks on one H200
  // (scripts/gpu/bench_cuda_ring.py, sizes 4 KiB x 4^i; docs/PERFORMANCE.md): k = 2
  // 256 KiB in 6 of 7 runs; k = 3, 4, 6 and 8 1 MiB in every run; k = 5 4 MiB
  // in 2 of 2, by 8%. k = 7 and k > 8 not measured.
  if (ranks < 2) return 0;
  return ranks == 2 ? 256 << 10 : 1 << 20;
}

std::string RunDeviceRing(const RingCall& call, const CudaRank& me,
                          const std::vector<int>& devices, DevicePath path) {
  cudaError_t err = cudaSetDevice(me.device);
  if (err != cudaSuccess) return CudaError("jaxring device ring: cudaSetDevice", err);
  std::string error;
  switch (Engine().Run(call, DeviceRank{me.in, me.out, me.acc, me.device, me.stream, call.key.run_id},
                       devices, path, &error)) {
    case DeviceEngine::Outcome::kLaunched:
      return "";
    case DeviceEngine::Outcome::kUseHostEngine:
      return RunCudaRing(call, me);
    default:
      return error;
  }
}

std::string TakeDeviceFailure(const RingCall& call, const std::vector<int>& devices) {
  return Engine().TakeFailure(call, devices);
}

int64_t DeviceLanes(const RingCall& call, bool one_shot) {
  return DeviceEngine::Lanes(call, ElementBytes(call.element_type), one_shot);
}

int DeviceRingBlocksPerSm(ffi::DataType type) {
  int fewest = 0;
  EngineTypes::Visit(type, [&](auto tag) {
    for (const Reduction reduction : {Reduction::kSum, Reduction::kMax}) {
      int blocks = 0;
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &blocks, KernelFor<typename decltype(tag)::type>(reduction), kThreads, 0);
      fewest = reduction == Reduction::kSum ? blocks : std::min(fewest, blocks);
    }
  });
  return fewest;
}

}  // namespace jaxring
