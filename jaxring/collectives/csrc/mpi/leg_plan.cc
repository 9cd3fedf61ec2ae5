#include "mpi/leg_plan.h"

#include <atomic>
#include <map>
#include <mutex>
#include <stdexcept>
#include <utility>

namespace jaxring {
namespace {

std::mutex registry_mu;  // the comms and the registering of plans
std::map<int64_t, std::vector<DeviceComm>> comms;  // comm id -> by device ordinal
int64_t plan_count = 0;

// Plans by id, in blocks allocated as ids reach them: a reader follows two
// pointers, with no lock, while a registration may be adding a block.
constexpr int64_t kPlansPerBlock = 4096;
constexpr int64_t kBlocks = 4096;  // 16.7 million legs lowered in one process
struct Block {
  std::atomic<const LegPlan*> plans[kPlansPerBlock] = {};
};
std::atomic<Block*> blocks[kBlocks] = {};

}  // namespace

void SetLegComm(int64_t comm_id, int64_t device_ordinal, uintptr_t handle) {
  const auto comm = reinterpret_cast<MPI_Comm>(handle);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);  // the waits report errors, naming processes
  DeviceComm device;
  device.comm = comm;
  MPI_Comm_rank(comm, &device.rank);
  MPI_Comm_size(comm, &device.size);
  std::lock_guard<std::mutex> lock(registry_mu);
  std::vector<DeviceComm>& by_device = comms[comm_id];
  if (by_device.size() <= static_cast<size_t>(device_ordinal)) by_device.resize(device_ordinal + 1);
  by_device[device_ordinal] = device;
}

int64_t RegisterLegPlan(int64_t comm_id, std::string_view dtype, int64_t reduction, int64_t tag,
                        int64_t timeout_ms, std::string what, int64_t algorithm, int64_t piece_elements,
                        int64_t mode) {
  const ElementType* type = FindElementType(dtype);
  if (std::string refused = RefuseTypeOrReduction(type, reduction, Mode::kAllReduce); !refused.empty()) {
    throw std::invalid_argument(refused + " (the leg across processes, " + what + ")");
  }
  const auto leg_algorithm = static_cast<LegAlgorithm>(algorithm);
  if (algorithm < 0 || algorithm > static_cast<int64_t>(LegAlgorithm::kDoubling) ||
      TraitsOf(static_cast<Mode>(mode)).name == nullptr ||
      (leg_algorithm != LegAlgorithm::kRing && static_cast<Mode>(mode) != Mode::kAllReduce)) {
    throw std::invalid_argument("jaxring: the leg across processes (" + what + ") got algorithm " +
                                std::to_string(algorithm) + " and mode " + std::to_string(mode) +
                                "; jaxring/collectives/mpi.py lowers the all-reduce (mode 0) by any algorithm, "
                                "and its phases (1, 2) around the ring (0) only");
  }
  std::lock_guard<std::mutex> lock(registry_mu);
  auto found = comms.find(comm_id);
  if (found == comms.end()) {
    throw std::invalid_argument("jaxring: no MPI communicator " + std::to_string(comm_id) + " for the leg (" +
                                what + "); jaxring/collectives/mpi.py sets one per communicator and local "
                                "device before it lowers a leg over it");
  }
  if (plan_count == kBlocks * kPlansPerBlock) {
    throw std::invalid_argument("jaxring: this process lowered " + std::to_string(plan_count) +
                                " legs across processes, the most it can hold");
  }
  auto* plan = new LegPlan{comm_id, type, static_cast<Reduction>(reduction), static_cast<int>(tag), timeout_ms,
                           std::move(what), leg_algorithm, piece_elements, static_cast<Mode>(mode), found->second};
  const int64_t id = plan_count++;
  Block* block = blocks[id / kPlansPerBlock].load(std::memory_order_relaxed);
  if (block == nullptr) {
    block = new Block();
    blocks[id / kPlansPerBlock].store(block, std::memory_order_release);
  }
  block->plans[id % kPlansPerBlock].store(plan, std::memory_order_release);
  return id;
}

const LegPlan* FindLegPlan(int64_t id) {
  if (id < 0 || id >= kBlocks * kPlansPerBlock) return nullptr;
  const Block* block = blocks[id / kPlansPerBlock].load(std::memory_order_acquire);
  return block == nullptr ? nullptr : block->plans[id % kPlansPerBlock].load(std::memory_order_acquire);
}

int64_t LegPlanCount() {
  std::lock_guard<std::mutex> lock(registry_mu);
  return plan_count;
}

}  // namespace jaxring
