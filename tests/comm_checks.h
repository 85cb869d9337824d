#pragma once
// Helpers of the communicator suites: per-rank failure lists (Boost.Test is
// not thread-safe, so ranks collect and the test thread reports) and small
// integer data whose reductions are exact in every dtype.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "dtensor/core/dtype.h"
#include "dtensor/core/reduce_op.h"

// Named (not anonymous) so that test-case lambdas may capture these types
// without -Wsubobject-linkage.
namespace comm_test {

using namespace dtensor;

const std::vector<int> kWorldSizes{1, 2, 3, 4, 6, 8};
constexpr DType kDTypes[] = {DType::Float32, DType::Float64, DType::Int64, DType::BFloat16, DType::Float16};

template <class T>
constexpr bool is_half_v = std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;

// Bitwise equality (the 16-bit types have no operator==), and a printable
// value.
template <class T>
bool same_value(T a, T b) {
  if constexpr (is_half_v<T>)
    return a.bits == b.bits;
  else
    return a == b;
}
template <class T>
double shown(T v) {
  return static_cast<double>(v);
}
constexpr ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min};

// Failures found on rank threads, reported on the test thread.
class Failures {
 public:
  explicit Failures(int n) : per_rank_(static_cast<std::size_t>(n)) {}
  void add(int rank, std::string msg) {
    auto& list = per_rank_[static_cast<std::size_t>(rank)];
    if (list.size() < 10) list.push_back(std::move(msg));
  }
  void report() const {
    std::size_t total = 0;
    for (std::size_t r = 0; r < per_rank_.size(); ++r) {
      total += per_rank_[r].size();
      for (const auto& msg : per_rank_[r]) BOOST_ERROR("rank " << r << ": " << msg);
    }
    BOOST_TEST(total == 0u, total << " check(s) failed on the ranks");
  }

 private:
  std::vector<std::vector<std::string>> per_rank_;
};

#define EXPECT_R(cond, ...)                                                                                            \
  do {                                                                                                                 \
    if (!(cond)) failures.add(rank, fmt::format("{}:{}: {}: ", __FILE__, __LINE__, #cond) + fmt::format(__VA_ARGS__)); \
  } while (0)

// Small integers: sums are exact in every dtype and any order, so results
// compare bitwise.
inline double value(std::uint64_t seed, int rank, std::size_t i) {
  return static_cast<double>(
      static_cast<std::int64_t>((seed * 7919 + static_cast<std::uint64_t>(rank) * 131 + i * 31) % 19) - 9);
}

template <class T>
void fill(std::vector<std::byte>& buf, std::size_t count, std::uint64_t seed, int rank) {
  buf.resize(count * sizeof(T));
  auto* p = reinterpret_cast<T*>(buf.data());
  for (std::size_t i = 0; i < count; ++i) p[i] = static_cast<T>(value(seed, rank, i));
}

// The 16-bit types reduce in float and round once (every backend does so):
// their expected value is the float one, rounded.
template <class T>
T reduce_expected(ReduceOp op, int n, std::uint64_t seed, std::size_t i) {
  if constexpr (is_half_v<T>) {
    return T(reduce_expected<float>(op, n, seed, i));
  } else {
    T acc = static_cast<T>(value(seed, 0, i));
    for (int r = 1; r < n; ++r) {
      const T v = static_cast<T>(value(seed, r, i));
      switch (op) {
        case ReduceOp::Sum:
        case ReduceOp::Avg: acc += v; break;
        case ReduceOp::Max: acc = std::max(acc, v); break;
        case ReduceOp::Min: acc = std::min(acc, v); break;
      }
    }
    if (op == ReduceOp::Avg) acc /= static_cast<T>(n);
    return acc;
  }
}

inline std::size_t seg_size(std::size_t count, int n, int r) {
  return count / static_cast<std::size_t>(n) +
         (static_cast<std::size_t>(r) < count % static_cast<std::size_t>(n) ? 1 : 0);
}

inline bool contains(std::string_view text, std::string_view needle) {
  return text.find(needle) != std::string_view::npos;
}

inline std::vector<std::size_t> random_sizes(std::mt19937_64& rng, int n, std::size_t max) {
  std::vector<std::size_t> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = (rng() % 4 == 0) ? 0 : rng() % (max + 1);
  return v;
}

}  // namespace comm_test
