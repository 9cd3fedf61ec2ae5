// The host side of the device-synchronised ring engine, free of CUDA: every
// CUDA call goes through CudaSeam, which cuda/device_ring.cu implements with
// the CUDA runtime and testing/module_engine_test.cc fakes for the CPU tests.
//
// What it guarantees:
// - Nothing process-wide and synchronising runs while a ring kernel may spin:
//   the first call of the engine in the process, before any ring exists (so
//   before any ring kernel is launched), loads the kernels on every device
//   (CUDA loads modules lazily, at the first launch, otherwise), enables peer
//   access between every pair of devices that can map each other, and makes each device's pool of flag words
//   and the host-mapped failure records and "finished" words. Later calls make no CUDA call but
//   the launch and pointer queries.
// - The calls of one op in one execution meet as every engine's do
//   (core/meeting.h). A rank waits on the host only for its peers of the same
//   meeting (to learn their buffers), never for another execution.
// - Each meeting runs on a session of its own: a flag block per rank and the
//   ring-wide epoch the meeting opened with, so no kernel of one execution
//   reads another's flags or buffers. A session serves a later meeting once
//   every rank's kernel of its last one has finished (each kernel's last block
//   writes the epoch it ran into a host-mapped word). Sessions are made as
//   meetings need them, but at most max_sessions of a ring may wait for their
//   kernels: a new meeting then waits for the device to finish one (an
//   execution that has started, never one that has not), so state stays
//   bounded by the executions in flight on the host plus max_sessions.
// - Each rank publishes its buffers and what it found wrong; whatever one rank
//   found (a device-side timeout its kernel recorded, buffers a peer cannot
//   map) fails the meeting on every rank, so no peer waits out a timeout for a
//   rank that gave up. No rank launches for a meeting some rank never came to
//   (a rank launches only once every rank is there), so nothing touches
//   freed buffers.
// - A ring's state is keyed by (op id, ring group) and remembers its devices:
//   the same op id on other devices is refused instead of sharing flags.
// - The device engine runs a ring only over NVLink-class links (peer access
//   with native atomics) unless forced; the choice is logged once per ring.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/ring_handler_common.h"
#include "core/ring_protocol.h"

namespace jaxring {

enum class DevicePath { kAuto, kRing, kOneShot };

// What a lane that gave up leaves for the host, in host-mapped memory;
// call 0: nothing to report.
struct LaneFailureRecord {
  uint64_t call;  // the failed call's KernelArgs::call_tag
  int64_t peer;
  uint64_t wanted;
  uint64_t seen;
};

// Threads of a lane's block; 16-byte packs each thread loads before it
// stores or adds any (cuda_elementwise.cuh), so a block has up to
// kThreads * kPacksPerPass * 16 bytes of each operand in flight; and bytes of
// a stage per lane (ring) or of a rank's output (one-shot), up to kMaxLanes:
// one such pass.
constexpr int kThreads = 256;
constexpr int kPacksPerPass = 8;
constexpr int64_t kBytesPerLane = int64_t{kThreads} * 16 * kPacksPerPass;

// Words of one rank's flag block in the pool: the (peer, lane) flags, then the
// count of the rank's finished kernel blocks on it (the last block of a call
// poisons the output if a lane of the call failed, then reports the call
// finished).
constexpr int kSlotWords = kFlagWords + 8;

struct KernelArgs {
  SchedulePlan plan;
  int64_t lanes;
  uint64_t epoch;
  // Names the call among every call of every ring on its devices (the ring's
  // serial number, then the epoch): failure records are shared by the rings
  // of one device set, whose epochs are counted apart.
  uint64_t call_tag;
  bool one_shot;
  Reduction reduction;
  uint64_t timeout_ns;
  uint64_t* flag_blocks[kMaxDeviceRanks];
  RankBuffers buffers[kMaxDeviceRanks];
  LaneFailureRecord* failures;  // this rank's, one per lane (device view)
  uint64_t* blocks_done;        // this rank's count of finished blocks
  uint64_t blocks_done_after;   // its value once this call's last block is done
  uint64_t* finished;           // host-mapped: the last block writes `epoch` here at the end
};

// How two devices are connected, for the engine choice.
enum class PeerLink { kNone, kPcie, kNvlink };

// Every CUDA call of the engine's host side.
class CudaSeam {
 public:
  virtual ~CudaSeam() = default;
  virtual int DeviceCount() = 0;
  // Loads every ring kernel on `device` (the module, without launching).
  virtual std::string LoadKernels(int device) = 0;
  // `bytes` of zeroed memory on `device`, the zeros landed when it returns.
  virtual std::string AllocZeroedDevice(int device, size_t bytes, void** ptr) = 0;
  // `bytes` of zeroed host memory mapped into every device.
  virtual std::string AllocMappedHost(size_t bytes, void** host, void** device_view) = 0;
  virtual PeerLink Link(int device, int peer) = 0;
  virtual std::string EnablePeerAccess(int device, int peer) = 0;
  // "" when kernels on `peer` can read `ptr` (memory of another device), else why not.
  virtual std::string PeerCanRead(const void* ptr, int peer) = 0;
  // The kernel for elements of `type` (a RingCall's element_type).
  virtual std::string Launch(xla::ffi::DataType type, const KernelArgs& args, void* stream) = 0;
};

// One rank's call as the engine sees it.
struct DeviceRank {
  const void* in;
  void* out;
  void* acc;
  int device;
  void* stream;
  int64_t run_id;
};

struct EngineOptions {
  bool any_link = false;      // run over PCIe too (JAXRING_CUDA_ENGINE=device-any-link)
  int64_t pool_slots = 4096;  // rank flag blocks per device
  // Closed sessions per ring whose kernels may not have finished: how many
  // executions of one op may be queued on the device before a new meeting
  // waits for one of them to finish.
  int64_t max_sessions = 16;
  std::function<void(const std::string&)> log;  // the engine choice, once per ring
  std::function<int64_t(int64_t ranks)> one_shot_max_bytes;
};

struct Published;

class DeviceEngine {
 public:
  DeviceEngine(CudaSeam* seam, EngineOptions options);
  ~DeviceEngine();
  DeviceEngine(const DeviceEngine&) = delete;
  DeviceEngine& operator=(const DeviceEngine&) = delete;

  enum class Outcome { kLaunched, kUseHostEngine, kFailed };
  // One rank's call: `devices` are the ring's device ordinals in rank order.
  // kUseHostEngine (the same on every rank of the ring): run the host-staged
  // engine instead. kFailed: *error says why (the same on every rank when the
  // ranks met).
  Outcome Run(const RingCall& call, const DeviceRank& me, const std::vector<int>& devices,
              DevicePath path, std::string* error);

  // The device-side failure this rank's kernels recorded since its last call
  // (and forgets it), or "": for callers that synchronised the stream.
  std::string TakeFailure(const RingCall& call, const std::vector<int>& devices);

  // Lanes (blocks of one rank's kernel) a call of this shape uses.
  static int64_t Lanes(const RingCall& call, int64_t element_bytes, bool one_shot);

 private:
  struct Ring;
  struct Session;
  Ring* RingFor(const RingCall& call, const std::vector<int>& devices, int device,
                std::string* error);
  std::string Prepare();
  std::string TakeFailureOf(int64_t set, int64_t rank);
  Session* Join(Ring* ring, const RingCall& call, int64_t run_id, Published mine, std::string* error);
  Session* FreeSession(Ring* ring, std::string* error);
  void Leave(Ring* ring, Session* session, int64_t rank, bool launched);
  bool Left(Ring* ring, Session* session, int64_t rank, bool launched);
  std::string Problem(Ring* ring, const RingCall& call, const DeviceRank& me);
  bool EveryoneArrived(Ring* ring, Session* session, const RingCall& call, std::string* error);

  CudaSeam* const seam_;
  const EngineOptions options_;
  const uint64_t id_;  // never reused: keys the per-thread cache
  std::mutex mu_;       // rings_, the pools; taken at a ring's first call on a thread
  bool prepared_ = false;
  std::string prepare_error_;
  std::vector<std::vector<PeerLink>> links_;
  std::vector<uint64_t*> pools_;   // per device, pool_slots x kSlotWords
  std::vector<int64_t> pool_used_;
  // Per device and pool slot, host-mapped: the epoch of the last call whose
  // kernel finished on that flag block (host and device views).
  uint64_t* finished_host_ = nullptr;
  uint64_t* finished_device_ = nullptr;
  LaneFailureRecord* failure_host_ = nullptr;
  LaneFailureRecord* failure_device_ = nullptr;
  std::map<std::vector<int>, int64_t> failure_sets_;  // device set -> first record index
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Ring>> rings_;
};

}  // namespace jaxring
