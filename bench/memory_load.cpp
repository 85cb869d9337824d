// Host memory under load: 8 thread ranks run steps of multi-MiB ops on
// shards of a new size each step (1 to 8 MiB per rank), keeping a few
// tensors alive across steps, and the process's resident memory is compared
// with the bytes of tensors alive at once. Prints RSS after the warm-up and
// at the end, the peak (getrusage), and the live bytes. Run:
// build/bench/memory_load [steps]
#include <dtensor/dtensor.h>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

using namespace dtensor;

namespace {

double rss_mib() { return static_cast<double>(resident_bytes()) / (1 << 20); }

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::stoi(argv[1]) : 60;
  constexpr int kRanks = 8, kKept = 4;
  std::atomic<std::int64_t> live_now{0}, live_peak{0};
  auto track = [&](std::int64_t delta) {
    const std::int64_t now = live_now += delta;
    std::int64_t peak = live_peak.load();
    while (now > peak && !live_peak.compare_exchange_weak(peak, now)) {
    }
  };
  double warm_rss = 0;
  run_threads(kRanks, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {kRanks});
    std::mt19937 rng(20261201);  // the same on every rank: shapes agree
    std::vector<DTensor> kept;
    std::vector<std::int64_t> kept_bytes;
    for (int step = 0; step < steps; ++step) {
      // rows x 1024 f32 per rank: 1 to 8 MiB, a new size each step.
      const std::int64_t rows = std::uniform_int_distribution<std::int64_t>(256, 2048)(rng);
      const std::int64_t shard = rows * 1024 * 4;
      DTensor x = DTensor::from_local(Tensor::rand({rows, 1024}, DType::Float32, step * kRanks + comm.rank()), mesh,
                                      Layout::parse("S(0)"));
      // Temporaries alive at once on this rank, at most: x, y, z, w and the
      // collective's buffers (about 2 shards).
      track(6 * shard);
      DTensor y = x * x + x;
      DTensor z = y.redistribute(Layout::parse("S(1)"));
      DTensor w = z * 2.0;
      track(-6 * shard);
      kept.push_back(w);
      kept_bytes.push_back(shard);
      track(shard);
      if (static_cast<int>(kept.size()) > kKept) {
        kept.erase(kept.begin());
        track(-kept_bytes.front());
        kept_bytes.erase(kept_bytes.begin());
      }
      comm.barrier();
      if (step == steps / 4 && comm.rank() == 0) warm_rss = rss_mib();
    }
  });
  const double live = static_cast<double>(live_peak.load()) / (1 << 20);
  const double end_rss = rss_mib();
  fmt::print("{} steps on {} rank threads, shards of 1-8 MiB: peak live {:.0f} MiB (an upper bound)\n", steps, kRanks,
             live);
  fmt::print("RSS after a quarter of the steps {:.0f} MiB, at the end {:.0f} MiB, peak {:.0f} MiB: {:.2f}x live\n",
             warm_rss, end_rss, peak_rss_mib(), peak_rss_mib() / live);
  const HostMemoryStats h = host_memory_stats();
  const double peak_in_use = static_cast<double>(h.peak_bytes_in_use) / (1 << 20);
  fmt::print("host cache: {} hits, {} misses, {} released, {:.0f} MiB cached of a {:.0f} MiB limit\n", h.hits, h.misses,
             h.releases, static_cast<double>(h.bytes_cached) / (1 << 20), static_cast<double>(h.limit) / (1 << 20));
  fmt::print("peak bytes in big blocks (every tensor and buffer of 128 KiB and up) {:.0f} MiB: peak RSS {:.2f}x that\n",
             peak_in_use, peak_rss_mib() / peak_in_use);
}
