// Local kernels on plain Tensors (pointwise and shape ops) next to memcpy of
// the same traffic, in one run, one thread. Run: build/bench/kernels [--reps=N]
// [--json]. bench/kernels_torch.py runs this with --json and prints PyTorch's
// time for the same ops beside it.
#include "kernels.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string_view>

namespace kbench {
namespace {

double seconds_of(const std::function<void()>& fn) {
  auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Row measure(std::string group, std::string name, const dtensor::Shape& shape, dtensor::DType dtype, double bytes,
            int reps, const std::function<void()>& fn) {
  const auto half = static_cast<std::size_t>(bytes / 2);
  std::vector<char> src(half, 1), dst(half, 0);  // touched once here, so no page faults are timed
  auto copy = [&] { std::memcpy(dst.data(), src.data(), half); };
  fn();  // warm up: first-call setup, page faults of the output
  copy();
  Row row{std::move(group), std::move(name), shape, dtype, bytes, 1e30, 1e30};
  for (int r = 0; r < reps; ++r) {
    // An untimed call first: the memcpy before evicted the op's operands
    // (1 MiB each for the 64x4096 rows) from L2, which PyTorch's side, timed
    // in back-to-back calls, never pays; timed cold, exp read 1.2-1.4x slower.
    fn();
    row.seconds = std::min(row.seconds, seconds_of(fn));
    row.memcpy_seconds = std::min(row.memcpy_seconds, seconds_of(copy));
  }
  return row;
}

}  // namespace kbench

int main(int argc, char** argv) {
  int reps = 20;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--json")
      json = true;
    else if (arg.starts_with("--reps="))
      reps = std::max(1, std::atoi(argv[i] + 7));
    else {
      fmt::print(stderr, "usage: kernels [--reps=N] [--json]; got {}\n", arg);
      return 2;
    }
  }
  std::vector<kbench::Row> rows;
  kbench::pointwise_rows(rows, reps);
  kbench::shape_rows(rows, reps);
  if (json) {
    for (const auto& r : rows)
      fmt::print(
          R"({{"group":"{}","name":"{}","shape":[{}],"dtype":"{}","bytes":{},"seconds":{:.9f},"memcpy_seconds":{:.9f}}})"
          "\n",
          r.group, r.name, fmt::join(r.shape, ","), r.dtype, r.bytes, r.seconds, r.memcpy_seconds);
    return 0;
  }
  fmt::print("local kernels on plain Tensors, one thread, best of {}; memcpy moves the same bytes in the same run\n",
             reps);
  fmt::print("{:<10} {:<24} {:<14} {:>6} {:>10} {:>10} {:>12}\n", "group", "op", "shape", "dtype", "us", "GB/s",
             "of memcpy");
  for (const auto& r : rows)
    fmt::print("{:<10} {:<24} {:<14} {:>6} {:>10.1f} {:>10.2f} {:>12.2f}\n", r.group, r.name,
               fmt::format("{}", fmt::join(r.shape, "x")), r.dtype, r.seconds * 1e6, r.bytes / r.seconds / 1e9,
               r.memcpy_seconds / r.seconds);
}
