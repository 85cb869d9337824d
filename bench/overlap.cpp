// How much of a started all_reduce hides under computation (OSU's overlap
// measure): for each size, the all_reduce alone (t_comm), a computation
// sized to it alone (t_compute), and the two together, started, computed,
// waited (t_total); overlap = 1 - (t_total - t_compute) / t_comm, in percent
// (0: nothing hidden, 100: the call cost nothing beside the computation).
//
//   build/bench/overlap --ranks 2                      # thread ranks
//   build/bench/overlap --ranks 2 --link 10us,5GB/s    # on a modelled link
//   mpirun -np 2 build/bench/overlap                   # MPI processes
//
// The computation is a loop of multiply-adds on a buffer that stays in the
// L1 cache, so that it competes for a core and not for memory bandwidth.
// Every row is rank 0's median over --reps repetitions.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "dtensor/mesh/launch.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// `rounds` passes of multiply-adds over 1024 floats; the result is returned
// so that the loop is not optimised away.
float burn(long rounds) {
  static std::vector<float> v(1024, 1.0f);
  float acc = 0;
  for (long r = 0; r < rounds; ++r)
    for (float& x : v) {
      x = x * 0.999f + 0.001f;
      acc += x;
    }
  return acc;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  return dtensor::launch(argc, argv, [&](dtensor::Communicator& world) {
    CLI::App app("overlap: a started all_reduce under computation");
    std::vector<double> sizes_mib{1, 4, 16, 64};
    int reps = 5;
    bool json = false;
    app.add_option("--sizes", sizes_mib, "all_reduce sizes in MiB");
    app.add_option("--reps", reps, "repetitions per measure (the median is shown)")->check(CLI::PositiveNumber);
    app.add_flag("--json", json, "one JSON object per size instead of the table");
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      if (world.rank() == 0) app.exit(e);
      return;
    }
    const bool show = world.rank() == 0;
    const auto link = world.link_model();
    volatile float sink = 0;

    // Rounds of burn() per second on this rank, measured once.
    const auto t0 = Clock::now();
    sink = sink + burn(20000);
    const double rounds_per_second = 20000 / seconds_since(t0);

    if (show && !json)
      fmt::print("backend {} on {} ranks, link {}\n{:>8} {:>10} {:>10} {:>10} {:>8}\n", world.backend(), world.size(),
                 link ? link->str() : "as the machine is", "MiB", "comm ms", "compute ms", "both ms", "overlap");
    for (double mib : sizes_mib) {
      const auto count = static_cast<std::size_t>(mib * 1024 * 1024 / sizeof(float));
      std::vector<float> data(count, 1.0f);
      auto timed = [&](auto&& body) {
        std::vector<double> t;
        for (int r = 0; r < reps; ++r) {
          world.barrier();
          const auto start = Clock::now();
          body();
          t.push_back(seconds_since(start));
        }
        return median(t);
      };
      const double comm = timed([&] {
        world.start_all_reduce(data.data(), data.data(), count, dtensor::DType::Float32, dtensor::ReduceOp::Max)
            .wait();
      });
      // Sized to the call: a first guess from the rate, then rescaled once
      // by what that guess measured (caches and clocks settle).
      long rounds = std::max(1L, static_cast<long>(comm * rounds_per_second));
      double compute = timed([&] { sink = sink + burn(rounds); });
      rounds = std::max(1L, static_cast<long>(static_cast<double>(rounds) * comm / compute));
      compute = timed([&] { sink = sink + burn(rounds); });
      const double both = timed([&] {
        dtensor::Work w =
            world.start_all_reduce(data.data(), data.data(), count, dtensor::DType::Float32, dtensor::ReduceOp::Max);
        sink = sink + burn(rounds);
        w.wait();
      });
      const double overlap = std::clamp(100.0 * (1.0 - (both - compute) / comm), 0.0, 100.0);
      if (!show) continue;
      if (json)
        fmt::print(
            "{{\"backend\": \"{}\", \"ranks\": {}, \"link\": \"{}\", \"mib\": {}, \"comm_s\": {:.6f}, "
            "\"compute_s\": {:.6f}, \"both_s\": {:.6f}, \"overlap_percent\": {:.1f}}}\n",
            world.backend(), world.size(), link ? link->str() : "", mib, comm, compute, both, overlap);
      else
        fmt::print("{:>8g} {:>10.2f} {:>10.2f} {:>10.2f} {:>7.0f}%\n", mib, comm * 1e3, compute * 1e3, both * 1e3,
                   overlap);
    }
    std::fflush(stdout);
  });
}
