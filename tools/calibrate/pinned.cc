// Pinned measurement threads and sample statistics.
#include "tools/calibrate/pinned.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "core/clock.h"

namespace moeserve::calibrate {
namespace {

// The CPUs this process may run on, in order.
std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    }
  }
  return cpus;
}

}  // namespace

std::vector<double> RunPinned(int threads, const std::function<void(int)>& fn) {
  const std::vector<int> cpus = AllowedCpus();
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<double> seconds(static_cast<size_t>(threads));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      if (!cpus.empty()) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpus[static_cast<size_t>(t) % cpus.size()], &one);
        pthread_setaffinity_np(pthread_self(), sizeof(one), &one);  // best effort
      }
      ready.fetch_add(1);
      while (!go.load()) std::this_thread::yield();
      Stopwatch sw;
      fn(t);
      seconds[static_cast<size_t>(t)] = sw.Seconds();
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  go.store(true);
  for (auto& th : pool) th.join();
  return seconds;
}

double Samples::Median() const {
  if (values.empty()) return 0;
  std::vector<double> v = values;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
double Samples::Min() const { return values.empty() ? 0 : *std::min_element(values.begin(), values.end()); }
double Samples::Max() const { return values.empty() ? 0 : *std::max_element(values.begin(), values.end()); }
double Samples::Spread() const {
  const double m = Median();
  return m > 0 ? (Max() - Min()) / m : 0;
}

}  // namespace moeserve::calibrate
