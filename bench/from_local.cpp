// What from_local's agreement check costs: DTensor::from_local with a global
// shape, checked (the default, one small all_gather) against trusted, on 4
// thread ranks, alternating the two in rounds so that both see the same
// machine. Prints microseconds per call, the median and the spread over
// rounds, and their ratio.
#include <dtensor/dtensor.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

using namespace dtensor;

namespace {

constexpr int kRanks = 4;
constexpr int kRounds = 15;
constexpr int kCallsPerRound = 400;

// Microseconds per from_local call on rank 0, over one round.
double time_round(Communicator& comm, const DeviceMesh& mesh, const Tensor& local, FromLocalCheck check) {
  const Layout layout = Layout::parse("S(0)");
  const Shape global{4 * kRanks, 64};
  comm.barrier();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kCallsPerRound; ++i) (void)DTensor::from_local(local, mesh, layout, global, check);
  comm.barrier();
  const std::chrono::duration<double, std::micro> took = std::chrono::steady_clock::now() - start;
  return took.count() / kCallsPerRound;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main() {
  std::vector<double> checked, trusted;
  run_threads(kRanks, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {kRanks});
    const Tensor local = Tensor::ones({4, 64});
    for (int round = 0; round < kRounds; ++round) {
      const double c = time_round(comm, mesh, local, FromLocalCheck::RanksAgree);
      const double t = time_round(comm, mesh, local, FromLocalCheck::Trust);
      if (comm.rank() == 0) {
        checked.push_back(c);
        trusted.push_back(t);
      }
    }
  });
  auto [cmin, cmax] = std::minmax_element(checked.begin(), checked.end());
  auto [tmin, tmax] = std::minmax_element(trusted.begin(), trusted.end());
  std::printf("from_local on %d thread ranks, %d rounds of %d calls (us per call, median [min, max]):\n", kRanks,
              kRounds, kCallsPerRound);
  std::printf("  checked: %.2f [%.2f, %.2f]\n", median(checked), *cmin, *cmax);
  std::printf("  trusted: %.2f [%.2f, %.2f]\n", median(trusted), *tmin, *tmax);
  std::printf("  check costs %.2f us per call\n", median(checked) - median(trusted));
  return 0;
}
