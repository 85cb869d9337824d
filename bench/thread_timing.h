#pragma once
// Per-thread CPU time, for benchmarks whose thread ranks share the machine:
// each rank times its own work, not the others'.
#include <time.h>

namespace dtensor::bench {

inline double thread_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

/// Seconds of this thread's CPU time per call of fn, over `reps` calls.
template <class Fn>
double seconds_per_call(int reps, Fn&& fn) {
  const double t0 = thread_seconds();
  for (int i = 0; i < reps; ++i) fn();
  return (thread_seconds() - t0) / reps;
}

}  // namespace dtensor::bench
