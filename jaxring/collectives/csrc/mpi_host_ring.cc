// The cross-process leg of jaxring.allreduce(..., processes=True) over host
// buffers, shared by the CPU and CUDA handlers (mpi_host_ring.h): a ring
// all-reduce of this device's chunk over the MPI processes of the
// communicator that jaxring/collectives/mpi.py registered for this device.
//
// The ring is ring_schedule.h's all-reduce with one process per rank: each
// stage receives from the left neighbour what this rank's stage reads and
// sends to the right neighbour what the right's stage reads (the same
// schedule evaluated for the right's rank), so each chunk is summed once, by
// one process, in one order, and every process ends with the same bits.
// Buffers have the accumulation type (float32 or int32; Python casts 16-bit
// floats before and after), so partial sums live in the output.
//
// Every wait polls MPI_Test against the deadline.
// Messages carry the op's tag, fixed when it is lowered, so collectives that
// XLA runs concurrently, or in different orders in different processes,
// never take each other's messages.
#include <mpi.h>
#include <sched.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "mpi_host_ring.h"
#include "mpi_ring.h"
#include "ring_schedule.h"

namespace jaxring {
namespace {

namespace ffi = xla::ffi;

// Spin (yielding the core) this long, then poll every millisecond: a long
// wait means a late process, and must not eat a core another process needs.
constexpr auto kSpin = std::chrono::milliseconds(100);

std::mutex comms_mu;
std::unordered_map<int64_t, MPI_Comm> comms;  // device ordinal -> communicator

std::string NoAnswer(const Leg& leg, int peer, const char* waiting_for) {
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%g", leg.timeout_s);
  return "jaxring.allreduce across processes (" + leg.what + " on device " +
         std::to_string(leg.device) + ", tag " + std::to_string(leg.tag) + "): rank " +
         std::to_string(leg.rank) + " of " + std::to_string(leg.size) + " waited " + seconds +
         " s " + waiting_for + "; no answer from rank " + std::to_string(peer) +
         " (stopped, dead, or in another call). The limit is set by timeout=, "
         "jaxring.set_default_timeout or $JAXRING_TIMEOUT_S. The processes are now out of "
         "step: the job must end (scripts/train.py aborts it on an uncaught exception, as "
         "python -m mpi4py does).";
}

// Waits for the receive from `left` and the send to `right`; "" or an error
// naming the process that did not answer.
std::string Wait(MPI_Request (&requests)[2], int left, int right, const Leg& leg) {
  const auto start = Clock::now();
  for (;;) {
    int done = 0;
    MPI_Testall(2, requests, &done, MPI_STATUSES_IGNORE);
    if (done) return "";
    const auto now = Clock::now();
    if (now > leg.deadline) {
      int received = 0;
      MPI_Test(&requests[0], &received, MPI_STATUS_IGNORE);
      if (!received) {
        MPI_Cancel(&requests[0]);  // no message will come: MPI_Finalize must not wait for it
        return NoAnswer(leg, left, "for its left neighbour's chunk");
      }
      return NoAnswer(leg, right, "for its right neighbour to take a chunk");
    }
    if (now - start < kSpin) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}

inline float Add(float a, float b) { return a + b; }
inline int32_t Add(int32_t a, int32_t b) {  // wraps around, as lax.psum does
  return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
}

template <typename T>
std::string RunRing(const T* in, T* out, int64_t elements, const Leg& leg) {
  if (leg.size == 1) {
    std::memcpy(out, in, elements * sizeof(T));
    return "";
  }
  const int left = static_cast<int>(Mod(leg.rank - 1, leg.size));
  const int right = static_cast<int>(Mod(leg.rank + 1, leg.size));
  // One slice per step: MPI moves a whole chunk per message.
  const auto mine = SchedulePlan::Make(Mode::kAllReduce, elements, leg.size, leg.rank,
                                       Max(elements, 1), 1);
  const auto theirs = SchedulePlan::Make(Mode::kAllReduce, elements, leg.size, right,
                                         Max(elements, 1), 1);
  for (int64_t i = 0; i < mine.StageCount(); ++i) {
    const Stage st = mine.StageAt(i);
    const Stage rt = theirs.StageAt(i);
    MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    // Received straight into the output: a stage's destination chunk is never
    // the chunk the right neighbour reads from this rank in the same stage.
    if (st.count > 0) {
      MPI_Irecv(out + st.dst, static_cast<int>(st.count * sizeof(T)), MPI_BYTE, left, leg.tag,
                leg.comm, &requests[0]);
    }
    if (rt.count > 0) {
      // The right reads this rank's input at its first reduce step, its partial
      // sums (in the output) after, and its output in the all-gather.
      const bool from_input = rt.kind == StageKind::kReduceFirst || rt.left_is_input;
      const T* source = (from_input ? in : out) + rt.src;
      MPI_Isend(source, static_cast<int>(rt.count * sizeof(T)), MPI_BYTE, right, leg.tag,
                leg.comm, &requests[1]);
    }
    if (auto error = Wait(requests, left, right, leg); !error.empty()) return error;
    if (st.kind != StageKind::kCopy) {
      for (int64_t j = 0; j < st.count; ++j) out[st.dst + j] = Add(in[st.src + j], out[st.dst + j]);
    }
  }
  return "";
}

}  // namespace

ffi::Error OpenLeg(int32_t device_ordinal, ffi::DataType type, int64_t tag, int64_t timeout_ms,
                   std::string_view what, Leg* leg) {
  {
    std::lock_guard<std::mutex> lock(comms_mu);
    auto found = comms.find(device_ordinal);
    if (found == comms.end()) {
      return ffi::Error::InvalidArgument(
          "jaxring: no MPI communicator for device " + std::to_string(device_ordinal) +
          "; jaxring.init() registers one per local device");
    }
    leg->comm = found->second;
  }
  if (type != ffi::DataType::F32 && type != ffi::DataType::S32) {
    return ffi::Error::InvalidArgument("jaxring: the cross-process leg takes float32 or int32");
  }
  MPI_Comm_rank(leg->comm, &leg->rank);
  MPI_Comm_size(leg->comm, &leg->size);
  leg->tag = static_cast<int>(tag);
  leg->device = device_ordinal;
  leg->deadline = DeadlineFor(timeout_ms);
  leg->timeout_s = timeout_ms > 0   ? timeout_ms / 1000.0
                   : timeout_ms < 0 ? kForeverSeconds
                                    : DefaultTimeoutSeconds();
  leg->what = std::string(what);
  return ffi::Error::Success();
}

std::string RunHostRing(ffi::DataType type, const void* in, void* out, int64_t elements,
                        const Leg& leg) {
  return type == ffi::DataType::F32
             ? RunRing(static_cast<const float*>(in), static_cast<float*>(out), elements, leg)
             : RunRing(static_cast<const int32_t*>(in), static_cast<int32_t*>(out), elements, leg);
}

void SetDeviceComm(int64_t device_ordinal, uintptr_t handle) {
  std::lock_guard<std::mutex> lock(comms_mu);
  comms[device_ordinal] = reinterpret_cast<MPI_Comm>(handle);
}

}  // namespace jaxring
