// The device ring's synchronisation protocol (ring_protocol.h) run by host
// threads, one per (rank, lane), over std::atomic flags: the CPU evidence for
// the code the GPU kernel runs, driven from tests/jaxring/collectives/test_ring_protocol.py.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/host_elementwise.h"
#include "core/ring_protocol.h"
#include "testing/host_barrier.h"

namespace nb = nanobind;

namespace jaxring {
namespace {

using Clock = std::chrono::steady_clock;
using Word = std::atomic<uint64_t>;

// Host primitives: release stores, acquire loads, and random pauses before
// each publish so that ranks interleave differently from run to run.
struct HostSync {
  using Word = jaxring::Word;
  Clock::time_point deadline;
  std::mt19937* rng;
  int max_delay_us;

  void Publish(Word* const* words, int count, uint64_t value) {
    if (max_delay_us > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(
          std::uniform_int_distribution<int>(0, max_delay_us)(*rng)));
    }
    for (int i = 0; i < count; ++i) words[i]->store(value, std::memory_order_release);
  }

  bool Wait(const Word* word, uint64_t value, uint64_t* seen) {
    for (int spins = 0;; ++spins) {
      *seen = word->load(std::memory_order_acquire);
      if (*seen >= value) return true;
      if (Clock::now() > deadline) return false;
      if (spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(20));
      else std::this_thread::yield();
    }
  }

  bool WaitEvery(const Word* first, int64_t stride, int count, uint64_t value, int64_t* which,
                 uint64_t* seen) {
    return WaitInTurn(*this, first, stride, count, value, which, seen);
  }
};

using Array = nb::ndarray<nb::numpy, nb::c_contig, nb::device::cpu>;

// Where each rank's operands live: one set per call, or (reuse) one set per
// rank that every call refills, as XLA reuses buffers from call to call.
template <typename T, typename Acc>
struct CallBuffers {
  std::vector<std::vector<T>> inputs, outputs;
  std::vector<std::vector<Acc>> partial_sums;
  std::vector<RankBuffers> buffers;  // [sets][ranks]
};

template <typename T, typename Acc>
std::vector<std::string> RunThreads(int64_t mode, const std::string& path, bool reuse_buffers, Array inputs,
                                    Array outputs, int64_t lanes, int64_t slice_elements,
                                    int max_delay_us,
                                    int64_t absent_rank, int64_t absent_from_call,
                                    double timeout_s, uint32_t seed) {
  const int64_t calls = inputs.shape(0), ranks = inputs.shape(1);
  const int64_t in_elements = inputs.shape(2), out_elements = outputs.shape(2);
  const Mode m = static_cast<Mode>(mode);
  const int64_t elements = TraitsOf(m).input_is_chunk() ? in_elements * ranks : in_elements;
  // Partial sums live apart from the output, as XLA's workspace holds them,
  // for reduce_scatter (one-chunk output) and 16-bit types.
  const bool separate_sums =
      TraitsOf(m).reduces && (TraitsOf(m).output_is_chunk() || sizeof(T) != sizeof(Acc));
  const int64_t sets = reuse_buffers ? 1 : calls;
  T* const all_outputs = static_cast<T*>(outputs.data());
  const T* const all_inputs = static_cast<const T*>(inputs.data());
  CallBuffers<T, Acc> own;
  own.partial_sums.resize(sets * ranks);
  own.buffers.resize(sets * ranks);
  if (reuse_buffers) {
    own.inputs.assign(ranks, std::vector<T>(in_elements));
    own.outputs.assign(ranks, std::vector<T>(out_elements));
  }
  for (int64_t c = 0; c < sets; ++c) {
    for (int64_t r = 0; r < ranks; ++r) {
      const int64_t i = c * ranks + r;
      T* out = reuse_buffers ? own.outputs[r].data() : all_outputs + i * out_elements;
      void* acc = out;
      if (separate_sums) {
        own.partial_sums[i].resize(elements);
        acc = own.partial_sums[i].data();
      }
      own.buffers[i] = RankBuffers{
          reuse_buffers ? own.inputs[r].data() : all_inputs + i * in_elements, out, acc};
    }
  }
  // The lanes of one rank meet between calls, as a rank's kernel ends before
  // its stream (and XLA, reusing the buffers) moves on.
  std::vector<std::unique_ptr<HostBarrier>> barriers;
  for (int64_t r = 0; r < ranks; ++r) barriers.emplace_back(new HostBarrier(lanes));
  std::vector<std::unique_ptr<Word[]>> blocks;
  std::vector<Word*> block_pointers;
  for (int64_t r = 0; r < ranks; ++r) {
    blocks.emplace_back(new Word[kFlagWords]);
    for (int i = 0; i < kFlagWords; ++i) blocks.back()[i].store(0);
    block_pointers.push_back(blocks.back().get());
  }
  std::vector<std::string> errors(ranks * lanes);
  {
    nb::gil_scoped_release release;
    std::vector<std::thread> threads;
    for (int64_t r = 0; r < ranks; ++r) {
      for (int64_t lane = 0; lane < lanes; ++lane) {
        threads.emplace_back([&, r, lane] {
          std::mt19937 rng(seed + static_cast<uint32_t>(r * lanes + lane));
          const int64_t align = TraitsOf(m).input_is_chunk() || TraitsOf(m).output_is_chunk()
                                    ? 1
                                    : 16 / static_cast<int64_t>(sizeof(T));
          const SchedulePlan plan =
              SchedulePlan::Make(m, elements, ranks, r, slice_elements, align);
          bool failed = false;
          for (int64_t c = 0; c < calls; ++c) {
            if (r == absent_rank && c >= absent_from_call) return;
            if (reuse_buffers) {
              barriers[r]->Arrive();
              if (lane == 0) {  // the next call's input, and a poisoned output
                std::memcpy(own.inputs[r].data(), all_inputs + (c * ranks + r) * in_elements,
                            in_elements * sizeof(T));
                std::memset(own.outputs[r].data(), 0xff, out_elements * sizeof(T));
              }
              barriers[r]->Arrive();
            }
            if (!failed) {
              const auto timeout = std::chrono::duration_cast<Clock::duration>(
                  std::chrono::duration<double>(timeout_s));
              HostSync sync{Clock::now() + timeout, &rng, max_delay_us};
              HostElementwise<> ew;
              const LaneCall<Word> call{ranks, r, lanes, lane, static_cast<uint64_t>(c + 1),
                                        block_pointers.data(),
                                        &own.buffers[(reuse_buffers ? 0 : c) * ranks]};
              const LaneOutcome outcome =
                  path == "one_shot" ? RunShotLane<T>(Shot::kOneShot, plan, call, sync, ew)
                  : path == "push"   ? RunShotLane<T>(Shot::kPush, plan, call, sync, ew)
                                     : RunRingLane<T, Acc>(plan, call, sync, ew);
              if (!outcome.ok) {
                // Later calls are skipped, but the rank's barriers still see this lane.
                errors[r * lanes + lane] = DescribeLaneFailure(r, outcome);
                failed = true;
              }
            }
            if (reuse_buffers) {
              barriers[r]->Arrive();
              if (lane == 0) {
                std::memcpy(all_outputs + (c * ranks + r) * out_elements, own.outputs[r].data(),
                            out_elements * sizeof(T));
              }
            }
          }
        });
      }
    }
    for (auto& t : threads) t.join();
  }
  return errors;
}

std::vector<std::string> RunProtocol(int64_t mode, const std::string& path, bool reuse_buffers,
                                     const std::string& dtype, Array inputs, Array outputs,
                                     int64_t lanes,
                                     int64_t slice_elements, int max_delay_us,
                                     int64_t absent_rank, int64_t absent_from_call,
                                     double timeout_s, uint32_t seed) {
  if (inputs.ndim() != 3 || outputs.ndim() != 3 || inputs.shape(0) != outputs.shape(0) ||
      inputs.shape(1) != outputs.shape(1)) {
    throw std::invalid_argument("inputs and outputs must be [calls, ranks, elements] arrays");
  }
  if (inputs.shape(1) < 1 || inputs.shape(1) > kMaxDeviceRanks || lanes < 1 ||
      lanes > kMaxLanes) {
    throw std::invalid_argument("ranks must be 1.." + std::to_string(kMaxDeviceRanks) +
                                " and lanes 1.." + std::to_string(kMaxLanes));
  }
  if (path != "ring" && path != "one_shot" && path != "push") {
    throw std::invalid_argument("path must be ring, one_shot or push, got '" + path + "'");
  }
  const size_t itemsize = dtype == "float16" || dtype == "bfloat16" ? 2 : 4;
  if (inputs.itemsize() != itemsize || outputs.itemsize() != itemsize) {
    throw std::invalid_argument("inputs and outputs must have " + std::to_string(itemsize) +
                                "-byte items for " + dtype);
  }
  auto run = [&](auto element, auto accumulator) {
    return RunThreads<decltype(element), decltype(accumulator)>(
        mode, path, reuse_buffers, inputs, outputs, lanes, slice_elements, max_delay_us,
        absent_rank,
        absent_from_call, timeout_s, seed);
  };
  if (dtype == "float32") return run(float{}, float{});
  if (dtype == "int32") return run(int32_t{}, int32_t{});
  if (dtype == "float16") return run(_Float16{}, float{});
  if (dtype == "bfloat16") return run(Bf16{}, float{});
  throw std::invalid_argument("dtype must be float32, bfloat16, float16 or int32, got '" + dtype +
                              "'");
}

// A symbolic run of one lane of the one-shot path: every flag operation and
// every data access, with the buffer and rank each pointer falls in.
using Event = std::tuple<std::string, int64_t, int64_t, int64_t, int64_t>;

struct RecordingSync {
  using Word = uint64_t;
  std::vector<Event>* events;
  const LaneCall<Word>* call;
  int64_t Peer(const Word* word) const {
    return (word - call->flag_blocks[call->rank]) / kMaxLanes;
  }
  void Publish(Word* const* words, int count, uint64_t value) {
    for (int i = 0; i < count; ++i) {
      const int64_t owner = (words[i] - call->flag_blocks[0]) / kFlagWords;
      events->emplace_back("publish", owner, static_cast<int64_t>(value & 0xffffffffu), 0, 0);
    }
  }
  bool Wait(const Word* word, uint64_t value, uint64_t* seen) {
    events->emplace_back("wait", Peer(word), static_cast<int64_t>(value & 0xffffffffu), 0, 0);
    *seen = value;
    return true;
  }
  bool WaitEvery(const Word* first, int64_t stride, int count, uint64_t value, int64_t* which,
                 uint64_t* seen) {
    return WaitInTurn(*this, first, stride, count, value, which, seen);
  }
};

// Inputs of rank p live at [p * stride, (p + 1) * stride) of one array, so a
// pointer tells its rank and offset.
struct RecordingElementwise {
  std::vector<Event>* events;
  const float* inputs;
  const float* out;
  int64_t stride;
  void Copy(float* dst, const float* src, int64_t n) {
    events->emplace_back("copy", dst - out, (src - inputs) / stride, (src - inputs) % stride, n);
  }
  void SumInRankOrder(const float* const* in, int ranks, int64_t offset, float* dst, int64_t n) {
    for (int p = 0; p < ranks; ++p) {
      if (in[p] != inputs + p * stride) throw std::logic_error("inputs out of rank order");
    }
    events->emplace_back("sum", dst - out, ranks, offset, n);
  }
};

std::vector<Event> RecordOneShot(int64_t mode, int64_t elements, int64_t ranks, int64_t rank,
                                 int64_t lanes, int64_t lane) {
  const Mode m = static_cast<Mode>(mode);
  // At least 1, so that an empty buffer still gives each rank its own place.
  const int64_t stride = Max(1, TraitsOf(m).input_is_chunk() ? elements / ranks : elements);
  std::vector<float> inputs(ranks * stride + 1), out(elements + 1);
  std::vector<uint64_t> flags(ranks * kFlagWords);
  std::vector<uint64_t*> blocks;
  std::vector<RankBuffers> buffers;
  for (int64_t p = 0; p < ranks; ++p) {
    blocks.push_back(flags.data() + p * kFlagWords);
    buffers.push_back(RankBuffers{inputs.data() + p * stride, out.data(), out.data()});
  }
  const LaneCall<uint64_t> call{ranks, rank, lanes, lane, 1, blocks.data(), buffers.data()};
  std::vector<Event> events;
  RecordingSync sync{&events, &call};
  RecordingElementwise ew{&events, inputs.data(), out.data(), stride};
  RunShotLane<float>(Shot::kOneShot, SchedulePlan::Make(m, elements, ranks, rank, 1, 1), call, sync,
                     ew);
  return events;
}

}  // namespace
}  // namespace jaxring

NB_MODULE(_jaxring_protocol, m) {
  m.def("run_threads", &jaxring::RunProtocol, nb::arg("mode"), nb::arg("path"),
        nb::arg("reuse_buffers"), nb::arg("dtype"), nb::arg("inputs"), nb::arg("outputs"), nb::arg("lanes"), nb::arg("slice_elements"),
        nb::arg("max_delay_us"), nb::arg("absent_rank"), nb::arg("absent_from_call"),
        nb::arg("timeout_s"), nb::arg("seed"),
        "Runs calls x ranks x lanes of the device protocol on host threads; fills `outputs` "
        "[calls, ranks, out_elements]; returns each (rank, lane)'s error, '' if none. With "
        "reuse_buffers, each rank refills one buffer set per call once all its lanes are done.");
  m.def("record_one_shot", &jaxring::RecordOneShot, nb::arg("mode"), nb::arg("elements"),
        nb::arg("ranks"), nb::arg("rank"), nb::arg("lanes"), nb::arg("lane"),
        "Events of one lane of the one-shot path: (publish, owner, progress, 0, 0), "
        "(wait, peer, progress, 0, 0), (copy, dst, src_rank, src, n), (sum, dst, ranks, src, n).");
  m.attr("MAX_RANKS") = jaxring::kMaxDeviceRanks;
  m.attr("MAX_LANES") = jaxring::kMaxLanes;
}
