// The strided copy and the transposes built on it, against element-by-element
// references (part of test_core).
#include <boost/test/unit_test.hpp>

#include "checks.h"
#include "support.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include <fmt/format.h>

#include "dtensor/core/error.h"
#include "dtensor/core/tensor.h"
#include "dtensor/core/detail/strided_copy.h"
#ifdef DTENSOR_TEST_HIGHWAY
// The targets the library is compiled for come with hwy_dep (libdtensor/meson.build).
#include <hwy/targets.h>
#endif

using namespace dtensor;
using dtensor::testing::check_throws;

// The one CPU strided copy (core/include/dtensor/core/detail/strided_copy.h) against its
// element-by-element reference: random shapes of 1-5 dims (sizes 0, 1 and
// sizes that are not a multiple of any tile edge), random boxes of random
// source and destination tensors, random permutations and broadcasts, every
// element size. Each case compares the whole destination buffer, so bytes
// outside the box must stay as they were.
BOOST_AUTO_TEST_SUITE(strided_copy)

namespace {

struct CopyCase {
  Shape size, src_strides, dst_strides;
  std::int64_t src_offset = 0, dst_offset = 0, src_elems = 0, dst_elems = 0;
  std::size_t itemsize = 4;
};

std::string describe(const CopyCase& c) {
  return fmt::format("size [{}] src strides [{}] at {} of {} dst strides [{}] at {} of {}, {}-byte elements",
                     fmt::join(c.size, ","), fmt::join(c.src_strides, ","), c.src_offset, c.src_elems,
                     fmt::join(c.dst_strides, ","), c.dst_offset, c.dst_elems, c.itemsize);
}

// A box of a row-major source tensor, its dims permuted (and some broadcast),
// into a box of a row-major destination tensor.
CopyCase random_case(std::mt19937_64& rng) {
  static constexpr std::int64_t kSizes[] = {0, 1, 1, 2, 3, 5, 7, 16, 31, 33, 64, 65, 70, 130};
  auto pick = [&](std::int64_t n) { return static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(n)); };
  CopyCase c;
  static constexpr std::size_t kItemsizes[] = {1, 2, 4, 8};
  c.itemsize = kItemsizes[pick(4)];
  const int nd = 1 + static_cast<int>(pick(5));
  // Keep each case small enough for the reference: shrink sizes until the
  // box has at most ~100k elements (the 2-d cases still reach full tiles).
  do {
    c.size.clear();
    for (int d = 0; d < nd; ++d) c.size.push_back(kSizes[pick(std::size(kSizes) - (nd > 3 ? 4 : 0))]);
  } while (numel(c.size) > 100000);
  std::vector<int> perm(nd);
  std::iota(perm.begin(), perm.end(), 0);
  if (pick(4) != 0) std::shuffle(perm.begin(), perm.end(), rng);
  // The source tensor holds the box in permuted order, with room around it.
  Shape src_shape(nd), src_off(nd), dst_shape(nd), dst_off(nd);
  for (int d = 0; d < nd; ++d) {
    const std::int64_t n = c.size[perm[d]];
    const std::int64_t pad = pick(3) == 0 ? pick(4) : 0;
    src_shape[d] = n + pad;
    src_off[d] = pad ? pick(pad + 1) : 0;
  }
  for (int d = 0; d < nd; ++d) {
    const std::int64_t pad = pick(3) == 0 ? pick(4) : 0;
    dst_shape[d] = c.size[d] + pad;
    dst_off[d] = pad ? pick(pad + 1) : 0;
  }
  const Shape ss = row_major_strides(src_shape), ds = row_major_strides(dst_shape);
  c.src_strides.resize(nd);
  for (int d = 0; d < nd; ++d) c.src_strides[perm[d]] = ss[d];
  if (pick(6) == 0) c.src_strides[pick(nd)] = 0;  // broadcast one dim
  c.dst_strides = ds;
  for (int d = 0; d < nd; ++d) {
    c.src_offset += src_off[d] * ss[d];
    c.dst_offset += dst_off[d] * ds[d];
  }
  c.src_elems = std::max<std::int64_t>(1, numel(src_shape));
  c.dst_elems = std::max<std::int64_t>(1, numel(dst_shape));
  return c;
}

}  // namespace

BOOST_AUTO_TEST_CASE(matches_the_element_by_element_copy, *boost::unit_test::timeout(120)) {
  const std::uint64_t seed = testing::seeded(20261201);
  std::mt19937_64 rng(seed);
  for (int k = 0; k < 400; ++k) {
    const CopyCase c = random_case(rng);
    const auto is = static_cast<std::int64_t>(c.itemsize);
    std::vector<std::byte> src(c.src_elems * is), fast(c.dst_elems * is);
    for (auto& b : src) b = static_cast<std::byte>(rng());
    for (auto& b : fast) b = static_cast<std::byte>(rng());
    std::vector<std::byte> slow = fast;
    cpu::copy_strided(src.data() + c.src_offset * is, c.src_strides, fast.data() + c.dst_offset * is, c.dst_strides,
                      c.size, c.itemsize);
    cpu::copy_strided_reference(src.data() + c.src_offset * is, c.src_strides, slow.data() + c.dst_offset * is,
                                c.dst_strides, c.size, c.itemsize);
    const auto diff = std::mismatch(fast.begin(), fast.end(), slow.begin());
    const bool same = diff.first == fast.end();
    BOOST_TEST_REQUIRE(same, fmt::format("seed {} case {}: {}: first wrong byte {} of {}", seed, k, describe(c),
                                         diff.first - fast.begin(), fast.size()));
  }
}

namespace {

// Transposes of every element size, larger planes than the random cases:
// many full tiles plus ragged edges. `where` names the SIMD target.
void check_transposes(std::string_view where) {
  for (std::size_t is : {1, 2, 4, 8})
    for (Shape size : {Shape{129, 200}, Shape{3, 67, 130}, Shape{64, 64}, Shape{260, 300}}) {
      const int nd = static_cast<int>(size.size());
      Shape src_shape = size;
      std::swap(src_shape[nd - 1], src_shape[nd - 2]);
      Shape ss = row_major_strides(src_shape);
      std::swap(ss[nd - 1], ss[nd - 2]);
      const Shape ds = row_major_strides(size);
      const auto n = static_cast<std::size_t>(numel(size));
      std::vector<std::byte> src(n * is), fast(n * is, std::byte{0}), slow(n * is, std::byte{0});
      for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 131 + i / 7);
      cpu::copy_strided(src.data(), ss, fast.data(), ds, size, is);
      cpu::copy_strided_reference(src.data(), ss, slow.data(), ds, size, is);
      const bool same = fast == slow;
      BOOST_TEST(same, fmt::format("{}: transpose of size [{}], {}-byte elements", where, fmt::join(size, ","), is));
    }
}

}  // namespace

BOOST_AUTO_TEST_CASE(transposes_of_every_element_size_hit_full_and_partial_tiles) { check_transposes("best target"); }

#ifdef DTENSOR_TEST_HIGHWAY
BOOST_AUTO_TEST_CASE(transposes_on_every_simd_target_the_cpu_has) {
  // The transposes are compiled once per SIMD target (16-, 32- and 64-byte
  // vectors on x86-64) and the CPU's best is chosen at run time; here each
  // target this CPU can run takes its turn.
  // Restores the CPU's own choice even where a check throws, so that later
  // cases do not run on the last target forced here.
  struct RestoreTargets {
    ~RestoreTargets() { hwy::SetSupportedTargetsForTest(0); }
  } restore;
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    check_transposes(hwy::TargetName(target));
  }
}
#endif

BOOST_AUTO_TEST_CASE(large_transposes_take_the_streaming_path, *boost::unit_test::timeout(120)) {
  // Outputs of 4 MiB and more are written with non-temporal stores, which
  // need aligned rows: odd sizes (ragged tiles on both edges), destinations
  // one element off alignment and padded destination rows (every row
  // aligned differently), around planes of a batch too.
  const std::uint64_t seed = testing::seeded(20261202);
  std::mt19937_64 rng(seed);
  for (std::size_t is : {1, 2, 4, 8}) {
    const std::int64_t rows = 1031, cols = static_cast<std::int64_t>((std::size_t{4} << 20) / is) / rows + 5;
    for (Shape size : {Shape{rows, cols}, Shape{3, cols / 3 + 1, rows}})
      for (std::int64_t dst_offset : {0, 1})
        for (std::int64_t pad : {0, 3}) {
          const int nd = static_cast<int>(size.size());
          Shape src_shape = size;
          std::swap(src_shape[nd - 1], src_shape[nd - 2]);
          Shape ss = row_major_strides(src_shape);
          std::swap(ss[nd - 1], ss[nd - 2]);
          Shape dst_shape = size;
          dst_shape[nd - 1] += pad;
          const Shape ds = row_major_strides(dst_shape);
          const auto n = static_cast<std::size_t>(numel(size)), m = static_cast<std::size_t>(numel(dst_shape));
          std::vector<std::byte> src(n * is), fast((m + 1) * is), slow;
          for (auto& b : src) b = static_cast<std::byte>(rng());
          for (auto& b : fast) b = static_cast<std::byte>(rng());
          slow = fast;
          cpu::copy_strided(src.data(), ss, fast.data() + dst_offset * static_cast<std::int64_t>(is), ds, size, is);
          cpu::copy_strided_reference(src.data(), ss, slow.data() + dst_offset * static_cast<std::int64_t>(is), ds,
                                      size, is);
          const auto diff = std::mismatch(fast.begin(), fast.end(), slow.begin());
          const bool same = diff.first == fast.end();
          BOOST_TEST(same, fmt::format("seed {}: transpose of size [{}] into rows padded by {} at offset {}, {}-byte "
                                       "elements: first wrong byte {} of {}",
                                       seed, fmt::join(size, ","), pad, dst_offset, is, diff.first - fast.begin(),
                                       fast.size()));
        }
  }
}

BOOST_AUTO_TEST_CASE(zero_dims_and_bad_element_sizes) {
  std::int64_t src = 7, dst = 0;
  const std::span<const std::int64_t> none;
  cpu::copy_strided(reinterpret_cast<const std::byte*>(&src), none, reinterpret_cast<std::byte*>(&dst), none, none, 8);
  BOOST_TEST(dst == 7);
  check_throws<Error>(
      [&] {
        cpu::copy_strided(reinterpret_cast<const std::byte*>(&src), none, reinterpret_cast<std::byte*>(&dst), none,
                          none, 3);
      },
      "3-byte elements");
}

BOOST_AUTO_TEST_SUITE_END()
