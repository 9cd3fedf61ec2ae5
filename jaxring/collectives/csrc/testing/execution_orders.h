// For the engines' host-thread tests (module_cpu_engine_test.cc, engine_fake.h,
// host_staged.h): a runtime that starts each device's executions in an order
// the test chooses, several at once.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

namespace jaxring {

// Plays a runtime that keeps up to `in_flight` executions in flight on each
// device: rank r starts the runs of orders[r] in that order, each on a thread
// of its own (`run_calls(rank, run)`), once fewer than `in_flight` of its
// runs are unfinished. Rank `late_rank` starts once every other rank's runs
// have returned. Returns when every run has.
inline void RunInOrders(const std::vector<std::vector<int64_t>>& orders, int64_t in_flight,
                        int64_t late_rank,
                        const std::function<void(int64_t rank, int64_t run)>& run_calls) {
  const int64_t ranks = static_cast<int64_t>(orders.size());
  std::mutex mu;
  std::condition_variable finished;
  std::vector<int64_t> unfinished(ranks, 0);
  size_t others_finished = 0, others_runs = 0;
  for (int64_t r = 0; r < ranks; ++r) others_runs += r == late_rank ? 0 : orders[r].size();
  std::vector<std::thread> launchers, runs;
  std::mutex runs_mu;
  for (int64_t rank = 0; rank < ranks; ++rank) {
    launchers.emplace_back([&, rank] {
      if (rank == late_rank) {
        std::unique_lock<std::mutex> lock(mu);
        finished.wait(lock, [&] { return others_finished == others_runs; });
      }
      for (const int64_t run : orders[rank]) {
        {
          std::unique_lock<std::mutex> lock(mu);
          finished.wait(lock, [&] { return unfinished[rank] < in_flight; });
          ++unfinished[rank];
        }
        std::lock_guard<std::mutex> lock(runs_mu);
        runs.emplace_back([&, rank, run] {
          run_calls(rank, run);
          std::lock_guard<std::mutex> lock(mu);
          --unfinished[rank];
          if (rank != late_rank) ++others_finished;
          finished.notify_all();
        });
      }
    });
  }
  for (auto& launcher : launchers) launcher.join();
  for (auto& run : runs) run.join();
}

// Rank r's order of `runs` runs: in every window of `in_flight`, shuffled.
inline std::vector<std::vector<int64_t>> ShuffledOrders(std::mt19937& rng, int ranks, int runs, int in_flight) {
  std::vector<std::vector<int64_t>> orders(ranks);
  for (auto& order : orders) {
    for (int start = 0; start < runs; start += in_flight) {
      std::vector<int64_t> window;
      for (int run = start; run < std::min(runs, start + in_flight); ++run) window.push_back(run);
      std::shuffle(window.begin(), window.end(), rng);
      order.insert(order.end(), window.begin(), window.end());
    }
  }
  return orders;
}

}  // namespace jaxring
