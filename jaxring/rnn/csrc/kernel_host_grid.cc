// kernel_host_shim.h's launches: one OS thread per block, the block's CUDA threads as fibers
// with small stacks, switched only at barriers, in a seeded random order (the header says
// why). A block's barriers are decided exactly, since only the block's own OS thread runs its
// fibers: when no fiber can run, either a whole warp waits at a warp barrier, or every thread
// waits at the same block or grid barrier, or all exited, or the kernel would hang on the GPU and
// the launch fails saying which threads wait where. The grid barrier is a counter under a mutex
// with a deadline, and knows which blocks finished, so blocks passing different numbers of
// grid.syncs fail at once rather than at the deadline.
#include "kernel_platform.cuh"  // the host branch: kernel_host_shim.h

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

namespace jaxring::rnn::host {
namespace {

// Fiber switching. ucontext's swapcontext saves and restores the signal mask, a system call each
// way, which made a launch's hundreds of thousands of switches cost most of its time; on x86-64 a
// switch saves the callee-saved registers and the floating-point control words on the stack it
// leaves and swaps stack pointers instead (the System V ABI's callee-saved state), elsewhere
// ucontext remains.
#if defined(__x86_64__)
extern "C" void jaxring_host_fiber_switch(void** save_stack_pointer, void* load_stack_pointer);
asm(R"(
  .text
  .globl jaxring_host_fiber_switch
  .hidden jaxring_host_fiber_switch
  .type jaxring_host_fiber_switch, @function
jaxring_host_fiber_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size jaxring_host_fiber_switch, .-jaxring_host_fiber_switch
)");

struct Context {
  void* stack_pointer = nullptr;
};

// A context that starts `entry` (which must never return) on [stack, stack + bytes): the frame
// jaxring_host_fiber_switch pops, its return address `entry`, under a null return address for
// `entry` itself so that its stack is aligned as after a call.
void Prepare(Context& context, unsigned char* stack, size_t bytes, void (*entry)()) {
  constexpr uint32_t kDefaultMxcsr = 0x1f80, kDefaultX87ControlWord = 0x037f;  // the ABI's initial modes
  auto* top = reinterpret_cast<uint64_t*>(reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t(15));
  *--top = 0;                                   // entry's return address: none
  *--top = reinterpret_cast<uint64_t>(entry);  // where the switch returns to
  for (int saved = 0; saved < 6; ++saved) *--top = 0;  // rbp, rbx, r12-r15
  *--top = uint64_t(kDefaultX87ControlWord) << 32 | kDefaultMxcsr;
  context.stack_pointer = top;
}

void Switch(Context& from, Context& to) { jaxring_host_fiber_switch(&from.stack_pointer, to.stack_pointer); }
#else
struct Context {
  ucontext_t context;
};

void Prepare(Context& context, unsigned char* stack, size_t bytes, void (*entry)()) {
  getcontext(&context.context);
  context.context.uc_stack.ss_sp = stack;
  context.context.uc_stack.ss_size = bytes;
  context.context.uc_link = nullptr;
  makecontext(&context.context, entry, 0);
}

void Switch(Context& from, Context& to) { swapcontext(&from.context, &to.context); }
#endif

constexpr int kWarpSize = 32;
constexpr int kMaxThreadsPerBlock = 1024;
// The most dynamic shared memory a block may opt in to on the GPUs plan.py plans for (H100's).
constexpr size_t kMaxSharedBytes = 227 * 1024;
// Each fiber's stack, a guard page below it: a kernel's frames plus whole wmma tiles (1 KiB per
// float accumulator) fit with room; pages are only committed when touched.
constexpr size_t kStackBytes = 128 * 1024;
// After a launch failed, how long its other blocks have to reach a barrier or finish before the
// process ends (a block in an endless loop cannot be stopped from outside).
constexpr double kStopSeconds = 10;
// Shared memory as the GPU aligns it; its bytes start as NaN, as stale shared memory would read.
constexpr size_t kSharedAlignment = 128;
constexpr unsigned char kStaleByte = 0xff;

enum class Wait { kRunning, kBlock, kGrid, kWarp, kExited };

const char* Describe(Wait wait) {
  switch (wait) {
    case Wait::kBlock: return "__syncthreads";
    case Wait::kGrid: return "grid.sync";
    case Wait::kWarp: return "a warp barrier";
    case Wait::kExited: return "exited";
    default: return "running";
  }
}

// The first error of a launch, which every block then stops at.
struct LaunchError {
  cudaError_t code = cudaSuccess;
  std::string message;
};

class Grid {
 public:
  Grid(int blocks, double barrier_seconds) : blocks_(blocks), waiting_(blocks, false), finished_(blocks, false),
                                             barrier_seconds_(barrier_seconds) {}

  void Fail(cudaError_t code, const std::string& message) {
    std::lock_guard<std::mutex> lock(mutex_);
    FailLocked(code, message);
  }

  bool Failed() {
    std::lock_guard<std::mutex> lock(mutex_);
    return error_.code != cudaSuccess;
  }

  // Waits until every block arrives; false when the launch failed meanwhile.
  bool Arrive(int block) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (error_.code != cudaSuccess) return false;
    if (FinishedBlocks() != "") {
      FailLocked(cudaErrorLaunchTimeout, "block " + std::to_string(block) + " waits at grid.sync, but blocks " +
                                             FinishedBlocks() + " finished without reaching it: the kernel would hang "
                                             "on the GPU (blocks pass different numbers of grid barriers)");
      return false;
    }
    waiting_[block] = true;
    if (++arrived_ == blocks_) {
      arrived_ = 0;
      waiting_.assign(blocks_, false);
      ++generation_;
      changed_.notify_all();
      return true;
    }
    const uint64_t generation = generation_;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(barrier_seconds_);
    while (generation_ == generation && error_.code == cudaSuccess) {
      if (changed_.wait_until(lock, deadline) == std::cv_status::timeout && generation_ == generation) {
        std::string absent;
        for (int b = 0; b < blocks_; ++b)
          if (!waiting_[b]) absent += (absent.empty() ? "" : ", ") + std::to_string(b);
        std::ostringstream message;
        message << "block " << block << " waited " << barrier_seconds_ << " s at grid.sync for blocks " << absent
                << ", which never arrived: the kernel would hang on the GPU (a block stuck in a loop?)";
        FailLocked(cudaErrorLaunchTimeout, message.str());
      }
    }
    return error_.code == cudaSuccess;
  }

  void Finish(int block) {
    std::lock_guard<std::mutex> lock(mutex_);
    finished_[block] = true;
    if (arrived_ > 0 && error_.code == cudaSuccess) {
      std::string waiting;
      for (int b = 0; b < blocks_; ++b)
        if (waiting_[b]) waiting += (waiting.empty() ? "" : ", ") + std::to_string(b);
      FailLocked(cudaErrorLaunchTimeout, "block " + std::to_string(block) + " finished while blocks " + waiting +
                                             " wait at grid.sync: the kernel would hang on the GPU (blocks pass "
                                             "different numbers of grid barriers)");
    }
  }

  LaunchError Error() {
    std::lock_guard<std::mutex> lock(mutex_);
    return error_;
  }

  // A block's OS thread is done with the launch.
  void Leave() {
    std::lock_guard<std::mutex> lock(mutex_);
    ++left_;
    changed_.notify_all();
  }

  // Waits for every block's OS thread to leave. After a failure, a block still running
  // kStopSeconds later is stuck in a loop the host cannot interrupt: the process ends with the
  // message rather than hang (the threads use the caller's arguments, so cannot be abandoned).
  void WaitForAll() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return left_ == blocks_ || error_.code != cudaSuccess; });
    if (changed_.wait_for(lock, std::chrono::duration<double>(kStopSeconds), [&] { return left_ == blocks_; }))
      return;
    std::fprintf(stderr, "kernel_host_grid: %s; blocks still running %g s later cannot be stopped, aborting\n",
                 error_.message.c_str(), kStopSeconds);
    std::abort();
  }

 private:
  void FailLocked(cudaError_t code, const std::string& message) {
    if (error_.code == cudaSuccess) error_ = {code, message};
    changed_.notify_all();
  }

  std::string FinishedBlocks() const {
    std::string finished;
    for (int b = 0; b < blocks_; ++b)
      if (finished_[b]) finished += (finished.empty() ? "" : ", ") + std::to_string(b);
    return finished;
  }

  const int blocks_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int arrived_ = 0, left_ = 0;
  uint64_t generation_ = 0;
  std::vector<bool> waiting_, finished_;
  const double barrier_seconds_;
  LaunchError error_;
};

struct Fiber {
  Context context;
  ThreadPlace place;
  Wait wait = Wait::kRunning;
  // The warp-collective call the fiber waits in (operation, pointer, ldm), or none for __syncwarp.
  const char* operation = nullptr;
  const void* pointer = nullptr;
  unsigned leading_dimension = 0;
  LaunchError fault;
#if defined(__SANITIZE_THREAD__)
  void* tsan_fiber = nullptr;
#endif
};

class Block;
thread_local Block* running_block = nullptr;

class Block {
 public:
  Block(Grid& grid, int index, int blocks, int threads, size_t shared_bytes, const std::function<void()>& body,
        uint64_t seed)
      : grid_(grid), index_(index), body_(body), fibers_(threads), random_(seed * 0x9e3779b97f4a7c15ull + index) {
    const size_t shared_allocated = RoundUp(shared_bytes, kSharedAlignment);
    shared_ = static_cast<unsigned char*>(std::aligned_alloc(kSharedAlignment, shared_allocated));
    std::memset(shared_, kStaleByte, shared_allocated);
    const size_t page = size_t(sysconf(_SC_PAGESIZE)), slot = kStackBytes + page;
    stacks_bytes_ = slot * threads;
    stacks_ = static_cast<unsigned char*>(
        mmap(nullptr, stacks_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    if (stacks_ == MAP_FAILED) throw std::runtime_error("kernel_host_grid: no memory for the fibers' stacks");
    for (int t = 0; t < threads; ++t) {
      Fiber& fiber = fibers_[t];
      mprotect(stacks_ + slot * t, page, PROT_NONE);  // an overflow faults instead of corrupting a neighbour
      fiber.place = {{unsigned(t), 0, 0}, {unsigned(index), 0, 0}, dim3(threads), dim3(blocks), shared_};
      Prepare(fiber.context, stacks_ + slot * t + page, kStackBytes, &Block::Start);
#if defined(__SANITIZE_THREAD__)
      fiber.tsan_fiber = __tsan_create_fiber(0);
#endif
      ready_.push_back(t);
    }
  }

  ~Block() {
#if defined(__SANITIZE_THREAD__)
    for (Fiber& fiber : fibers_) __tsan_destroy_fiber(fiber.tsan_fiber);
#endif
    munmap(stacks_, stacks_bytes_);
    std::free(shared_);
  }

  void Run() {
    running_block = this;
#if defined(__SANITIZE_THREAD__)
    scheduler_tsan_fiber_ = __tsan_get_current_fiber();
#endif
    while (true) {
      while (!ready_.empty()) {
        size_t pick = random_() % ready_.size();
        current_ = ready_[pick];
        ready_[pick] = ready_.back();
        ready_.pop_back();
        Fiber& fiber = fibers_[current_];
        fiber.wait = Wait::kRunning;
#if defined(__SANITIZE_THREAD__)
        __tsan_switch_to_fiber(fiber.tsan_fiber, 0);
#endif
        Switch(scheduler_, fiber.context);
        if (fiber.fault.code != cudaSuccess) {
          grid_.Fail(fiber.fault.code, "block " + std::to_string(index_) + " thread " + std::to_string(current_) +
                                           ": " + fiber.fault.message);
          return;
        }
      }
      if (!ReleaseWarps() && !ReleaseBlock()) return;
    }
  }

  Fiber& Current() { return fibers_[current_]; }

  // Called by the running fiber: parks it at `wait` and returns when the barrier releases it.
  void Park(Wait wait) {
    Fiber& fiber = Current();
    fiber.wait = wait;
#if defined(__SANITIZE_THREAD__)
    __tsan_switch_to_fiber(scheduler_tsan_fiber_, 0);
#endif
    Switch(fiber.context, scheduler_);
  }

 private:
  static size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to + (n == 0 ? to : 0); }

  static void Start() {
    Block& block = *running_block;
    Fiber& fiber = block.Current();
    try {
      block.body_();
    } catch (const KernelFault& fault) {
      fiber.fault = {fault.code, fault.what()};
    } catch (const std::exception& error) {
      fiber.fault = {cudaErrorLaunchFailure, error.what()};
    }
    fiber.wait = Wait::kExited;
#if defined(__SANITIZE_THREAD__)
    __tsan_switch_to_fiber(block.scheduler_tsan_fiber_, 0);
#endif
    Switch(fiber.context, block.scheduler_);  // never resumed
  }

  // Releases every warp whose lanes all wait at the same warp barrier; false if none did.
  // Fails the launch for a warp whose waiting lanes meet exited ones or other barriers.
  bool ReleaseWarps() {
    bool released = false;
    const int threads = int(fibers_.size());
    for (int first = 0; first < threads; first += kWarpSize) {
      const int last = std::min(first + kWarpSize, threads);
      int at_warp = 0;
      for (int t = first; t < last; ++t) at_warp += fibers_[t].wait == Wait::kWarp;
      if (at_warp == 0) continue;
      const int warp = first / kWarpSize;
      if (at_warp < last - first) {
        Fail("warp " + std::to_string(warp) + " would hang: " + Census(first, last) +
             " (a warp barrier or wmma call that not every lane reaches)");
        return false;
      }
      const Fiber& lead = fibers_[first];
      for (int t = first + 1; t < last; ++t) {
        const Fiber& lane = fibers_[t];
        if (lane.operation != lead.operation || lane.pointer != lead.pointer ||
            lane.leading_dimension != lead.leading_dimension) {
          Fail("warp " + std::to_string(warp) + ": lane " + std::to_string(t - first) + " calls " +
               Name(lane) + " while lane 0 calls " + Name(lead) +
               ": a warp-collective call needs every lane with the same arguments");
          return false;
        }
      }
      for (int t = first; t < last; ++t) ready_.push_back(t);
      released = true;
    }
    return released;
  }

  // With no fiber ready and no warp to release: opens the barrier every thread waits at and
  // returns true, or returns false when the block is done or the launch failed.
  bool ReleaseBlock() {
    const Wait first = fibers_[0].wait;
    bool same = true, exited = true;
    for (const Fiber& fiber : fibers_) same &= fiber.wait == first, exited &= fiber.wait == Wait::kExited;
    if (exited) {
      grid_.Finish(index_);
      return false;
    }
    if (!same) {
      Fail("the block would hang: " + Census(0, int(fibers_.size())) +
           " (a barrier that not every thread reaches, or different barriers)");
      return false;
    }
    if (first == Wait::kGrid && !grid_.Arrive(index_)) return false;
    if (grid_.Failed()) return false;  // another block faulted: stop at this barrier
    for (int t = 0; t < int(fibers_.size()); ++t) ready_.push_back(t);
    return true;
  }

  // Which threads of [first, last) wait where, as ranges: "threads 0-4 wait at __syncthreads, 5 exited".
  std::string Census(int first, int last) const {
    std::string text;
    for (int t = first; t < last;) {
      int end = t;
      while (end + 1 < last && fibers_[end + 1].wait == fibers_[t].wait) ++end;
      text += (text.empty() ? "threads " : ", ") + std::to_string(t) + (end > t ? "-" + std::to_string(end) : "") +
              (fibers_[t].wait == Wait::kExited ? " exited" : std::string(" wait at ") + Describe(fibers_[t].wait));
      t = end + 1;
    }
    return text;
  }

  static std::string Name(const Fiber& fiber) {
    if (!fiber.operation) return "__syncwarp";
    std::ostringstream name;
    name << fiber.operation << "(" << fiber.pointer << ", ldm " << fiber.leading_dimension << ")";
    return name.str();
  }

  void Fail(const std::string& message) {
    grid_.Fail(cudaErrorLaunchTimeout, "block " + std::to_string(index_) + ": " + message);
  }

  Grid& grid_;
  const int index_;
  const std::function<void()>& body_;
  std::vector<Fiber> fibers_;
  std::vector<int> ready_;
  std::mt19937_64 random_;
  Context scheduler_;
  int current_ = 0;
  unsigned char* shared_ = nullptr;
  unsigned char* stacks_ = nullptr;
  size_t stacks_bytes_ = 0;
#if defined(__SANITIZE_THREAD__)
  void* scheduler_tsan_fiber_ = nullptr;
#endif
};

thread_local std::string last_launch_error;

Block& RunningBlock() {
  if (!running_block)
    throw KernelFault(cudaErrorNotPermitted, "a CUDA thread's built-in or barrier was used outside a kernel launch");
  return *running_block;
}

}  // namespace

const ThreadPlace& Here() { return RunningBlock().Current().place; }

void SyncBlock() { RunningBlock().Park(Wait::kBlock); }
void SyncGrid() { RunningBlock().Park(Wait::kGrid); }
void SyncWarp() { WarpCollective(nullptr, nullptr, 0); }

void WarpCollective(const char* operation, const void* pointer, unsigned leading_dimension) {
  Block& block = RunningBlock();
  Fiber& fiber = block.Current();
  fiber.operation = operation, fiber.pointer = pointer, fiber.leading_dimension = leading_dimension;
  block.Park(Wait::kWarp);
}

LaunchOptions& Options() {
  static LaunchOptions options;
  return options;
}

const std::string& LastLaunchError() { return last_launch_error; }

cudaError_t RunGrid(int blocks, int threads, size_t shared_bytes, const std::function<void()>& thread_body) {
  last_launch_error.clear();
  if (blocks < 1 || threads < 1 || threads > kMaxThreadsPerBlock) {
    last_launch_error = "launch of " + std::to_string(blocks) + " blocks x " + std::to_string(threads) +
                        " threads: need at least one block and 1 to 1024 threads per block";
    return cudaErrorInvalidConfiguration;
  }
  if (shared_bytes > kMaxSharedBytes) {
    last_launch_error = "launch asks " + std::to_string(shared_bytes) + " bytes of shared memory per block, over " +
                        std::to_string(kMaxSharedBytes) + " (H100's opt-in maximum): plan.py should have refused";
    return cudaErrorInvalidValue;
  }
  const LaunchOptions options = Options();
  Grid grid(blocks, options.barrier_seconds);
  std::vector<std::thread> workers;
  for (int b = 0; b < blocks; ++b)
    workers.emplace_back([&, b] {
      try {
        Block block(grid, b, blocks, threads, shared_bytes, thread_body, options.seed);
        block.Run();
      } catch (const std::exception& error) {
        grid.Fail(cudaErrorLaunchFailure, "block " + std::to_string(b) + ": " + error.what());
      }
      running_block = nullptr;
      grid.Leave();
    });
  grid.WaitForAll();
  for (std::thread& worker : workers) worker.join();
  const LaunchError error = grid.Error();
  last_launch_error = error.message;
  return error.code;
}

}  // namespace jaxring::rnn::host
