// Ground types: placements and their text form, torch.chunk shard
// arithmetic, nesting orders, box algebra, Tensor and seeded random fill.
#include <boost/test/unit_test.hpp>

#include "checks.h"
#include "support.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "dtensor/core/error.h"
#include "dtensor/core/hash.h"
#include "dtensor/core/inline_vector.h"
#include "dtensor/core/placement.h"
#include "dtensor/core/tensor.h"
#include "dtensor/core/detail/host_blocks.h"

using namespace dtensor;
using dtensor::testing::check_throws;

BOOST_AUTO_TEST_SUITE(placements)

BOOST_AUTO_TEST_CASE(print_and_parse_round_trip) {
  for (std::string text :
       {"S(0),R,P(sum)", "R", "P(max),S(1)", "S(0),S(0)", "S(0)[1],S(0)[0]", "P(avg),P(avg),R,S(2)"}) {
    BOOST_TEST_CONTEXT("text " << text) { BOOST_TEST(fmt::format("{}", Layout::parse(text)) == text); }
  }
  BOOST_TEST(fmt::format("{}", Layout::parse("Shard(dim=1), Replicate(), Partial(min)")) == "S(1),R,P(min)");
  BOOST_TEST(fmt::format("{}", Layout({Shard{0}, Replicate{}, Partial{ReduceOp::Avg}})) == "S(0),R,P(avg)");
  // A default order written out explicitly prints without levels.
  BOOST_TEST(fmt::format("{}", Layout::parse("S(0)[0],S(0)[1]")) == "S(0),S(0)");
}

BOOST_AUTO_TEST_CASE(parse_errors_name_the_text) {
  check_throws<ParseError>([] { Layout::parse("S(0),Q"); }, "'Q'");
  check_throws<ParseError>([] { Layout::parse("S(x)"); }, "'S(x)'");
  check_throws<ParseError>([] { Layout::parse("P(prod)"); }, "P(prod)");
  check_throws<ParseError>([] { Layout::parse(""); }, "empty");
  check_throws<ParseError>([] { Layout::parse("S(0)[1],S(0)[1]"); }, "nesting levels");
  check_throws<ParseError>([] { Layout::parse("R[0]"); }, "only a shard");
  check_throws<LayoutError>(
      [] {
        Layout({Shard{0}, Shard{0}}, std::vector<std::pair<std::int64_t, std::vector<int>>>{{0, {1}}});
      },
      "split order [1]");
}

BOOST_AUTO_TEST_CASE(equality_and_hash_agree) {
  Layout a = Layout::parse("S(0),S(0)");
  Layout b({Shard{0}, Shard{0}}, std::vector<std::pair<std::int64_t, std::vector<int>>>{{0, {0, 1}}});
  Layout c = Layout::parse("S(0)[1],S(0)[0]");
  BOOST_TEST((a == b));
  BOOST_TEST(a.hash() == b.hash());
  BOOST_TEST(!(a == c));
  BOOST_TEST(c.split_order(0) == std::vector<int>({1, 0}));
  BOOST_TEST(c.innermost(0) == 0);
  // with() makes the new shard innermost.
  Layout d = Layout::parse("S(0),R").with(1, Shard{0});
  BOOST_TEST(d.split_order(0) == std::vector<int>({0, 1}));
  Layout e = Layout::parse("R,S(0)").with(0, Shard{0});
  BOOST_TEST(e.split_order(0) == std::vector<int>({1, 0}));
  BOOST_TEST(fmt::format("{}", e) == "S(0)[1],S(0)[0]");
}

BOOST_AUTO_TEST_CASE(validation_names_the_bad_value) {
  Shape mesh{2, 2}, shape{4, 4};
  check_throws<LayoutError>([&] { validate_layout(Layout::parse("S(2),R"), mesh, shape); }, "Shard(2) on mesh dim 0");
  check_throws<LayoutError>([&] { validate_layout(Layout::parse("R"), mesh, shape); }, "1 placements for a mesh of 2");
  check_throws<LayoutError>([&] { validate_layout(Layout::parse("P(sum),P(max)"), mesh, shape); }, "mixes");
  BOOST_TEST(fmt::format("{}", validate_layout(Layout::parse("S(-1),R"), mesh, shape)) == "S(1),R");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(inline_vector)

// Random edits applied to an InlineVector and a std::vector side by side,
// across the inline/heap boundary (N = 6): every step must agree.
BOOST_AUTO_TEST_CASE(random_edits_match_std_vector) {
  const std::uint64_t seed = testing::seeded(20261202);
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 200; ++round) {
    Shape v;
    std::vector<std::int64_t> ref;
    for (int step = 0; step < 40; ++step) {
      const int what = static_cast<int>(rng() % 8);
      const auto value = static_cast<std::int64_t>(rng() % 100);
      const std::size_t at = ref.empty() ? 0 : rng() % (ref.size() + 1);
      switch (what) {
        case 0:
        case 1:
          v.push_back(value);
          ref.push_back(value);
          break;
        case 2:
          if (!ref.empty()) {
            v.push_back(v[0]);
            ref.push_back(ref[0]);
          }
          break;  // an element of itself
        case 3:
          v.insert(v.begin() + at, value);
          ref.insert(ref.begin() + at, value);
          break;
        case 4:
          if (at < ref.size()) {
            v.erase(v.begin() + at);
            ref.erase(ref.begin() + at);
          }
          break;
        case 5: {
          const std::size_t n = rng() % 10;
          v.resize(n, value);
          ref.resize(n, value);
          break;
        }
        case 6: {
          Shape moved = std::move(v);
          v = moved;
          break;
        }  // through a move and a copy
        case 7:
          v.insert(v.begin() + at, v.begin(), v.end());
          ref.insert(ref.begin() + at, ref.begin(), ref.end());
          break;  // its own range
      }
      BOOST_TEST_CONTEXT("seed " << seed << ", round " << round << ", step " << step << ", edit " << what) {
        BOOST_TEST_REQUIRE(std::vector<std::int64_t>(v) == ref);
        BOOST_TEST(v.capacity() >= v.size());
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(holds_six_inline_and_compares_like_a_vector) {
  Shape six{1, 2, 3, 4, 5, 6};
  BOOST_TEST(six.heap_bytes() == 0u);
  Shape seven = six;
  seven.push_back(7);
  BOOST_TEST(seven.heap_bytes() >= 7 * sizeof(std::int64_t));
  const Shape moved = std::move(seven);
  BOOST_TEST(moved.size() == 7u);
  BOOST_TEST(seven.empty());  // NOLINT: a moved-from InlineVector is empty, as a std::vector is
  BOOST_TEST((six < moved));
  BOOST_TEST((Shape{2} > Shape{1, 9}));
  BOOST_TEST((six == std::vector<std::int64_t>{1, 2, 3, 4, 5, 6}));
  BOOST_TEST(fmt::format("{}", fmt::join(moved, "x")) == "1x2x3x4x5x6x7");
}

BOOST_AUTO_TEST_CASE(inline_array_holds_n_values_inside_up_to_its_bound) {
  InlineArray<std::string, 2> two(2);
  const auto* inside = reinterpret_cast<const std::byte*>(&two);
  const auto* first = reinterpret_cast<const std::byte*>(two.data());
  BOOST_TEST((first >= inside && first < inside + sizeof two));
  BOOST_TEST(two.size() == 2u);
  BOOST_TEST((two[0].empty() && two[1].empty()));
  InlineArray<std::string, 2> three(3);
  first = reinterpret_cast<const std::byte*>(three.data());
  inside = reinterpret_cast<const std::byte*>(&three);
  BOOST_TEST(!(first >= inside && first < inside + sizeof three));
  three[2] = "on the heap";
  BOOST_TEST(std::count(three.begin(), three.end(), std::string()) == 2);
  const InlineArray<std::string, 2> none(0);
  BOOST_TEST(none.size() == 0u);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(hashes)

// from_local compares fnv1a of a layout's text across ranks (and MPI
// processes): the published FNV-1a values, whatever the build.
BOOST_AUTO_TEST_CASE(fnv1a_is_the_published_function) {
  BOOST_TEST(fnv1a("") == 0xcbf29ce484222325ull);
  BOOST_TEST(fnv1a("a") == 0xaf63dc4c8601ec8cull);
  BOOST_TEST(fnv1a("foobar") == 0x85944171f73967e8ull);
  // FieldHasher: a string's bytes, then its length, one step each.
  BOOST_TEST(hash_fields(std::string("a")) == fnv1a_mix(fnv1a("a"), 1));
  BOOST_TEST(hash_fields(1, 2) != hash_fields(2, 1));
}

BOOST_AUTO_TEST_CASE(hash_combine_depends_on_order) {
  std::size_t a = 0, b = 0;
  hash_combine(a, 1);
  hash_combine(a, 2);
  hash_combine(b, 2);
  hash_combine(b, 1);
  BOOST_TEST(a != b);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(shard_arithmetic)

BOOST_AUTO_TEST_CASE(torch_chunk_examples) {
  auto sizes = [](std::int64_t s, std::int64_t n) {
    std::vector<std::int64_t> out;
    for (std::int64_t k = 0; k < n; ++k) out.push_back(chunk(s, n, k).size);
    return out;
  };
  BOOST_TEST(sizes(10, 4) == std::vector<std::int64_t>({3, 3, 3, 1}));
  BOOST_TEST(sizes(5, 4) == std::vector<std::int64_t>({2, 2, 1, 0}));
  BOOST_TEST(sizes(2, 4) == std::vector<std::int64_t>({1, 1, 0, 0}));
  BOOST_TEST(sizes(0, 3) == std::vector<std::int64_t>({0, 0, 0}));
  BOOST_TEST(chunk(5, 4, 3).offset == 5);  // empty shards report the extent
  BOOST_TEST(chunk(10, 4, 3).offset == 9);
}

BOOST_AUTO_TEST_CASE(nested_shards_follow_pytorch) {
  // A [2,5] tensor as (S(1),S(1)) on a 2x2 mesh: columns 2,1,1,1 at 0,2,3,4.
  Shape mesh{2, 2}, shape{2, 5};
  Layout l = Layout::parse("S(1),S(1)");
  std::vector<std::int64_t> sizes, offsets;
  for (std::int64_t r = 0; r < 4; ++r) {
    Box b = local_box(mesh, shape, l, unravel_index(r, mesh));
    sizes.push_back(b.size[1]);
    offsets.push_back(b.offset[1]);
  }
  BOOST_TEST(sizes == std::vector<std::int64_t>({2, 1, 1, 1}));
  BOOST_TEST(offsets == std::vector<std::int64_t>({0, 2, 3, 4}));
}

BOOST_AUTO_TEST_CASE(fsdp_over_tp_order) {
  // 8 rows on a 2x2 (dp,tp) mesh split by tp first: rows 0-1, 4-5, 2-3, 6-7.
  Shape mesh{2, 2}, shape{8, 3};
  Layout l = Layout::parse("S(0)[1],S(0)[0]");
  std::vector<std::int64_t> starts;
  for (std::int64_t r = 0; r < 4; ++r) starts.push_back(local_box(mesh, shape, l, unravel_index(r, mesh)).offset[0]);
  BOOST_TEST(starts == std::vector<std::int64_t>({0, 4, 2, 6}));
}

BOOST_AUTO_TEST_CASE(shards_tile_the_tensor, *boost::unit_test::timeout(60)) {
  // Property: for random meshes, shapes and layouts, the shards of the ranks
  // with coordinate 0 on every non-sharding mesh dim tile the tensor exactly.
  const unsigned seed = 20261130;
  std::mt19937 rng(seed);
  for (int iter = 0; iter < 500; ++iter) {
    int mesh_nd = 1 + rng() % 3, nd = 1 + rng() % 3;
    Shape mesh(mesh_nd), shape(nd);
    for (auto& m : mesh) m = 1 + rng() % 3;
    for (auto& s : shape) s = rng() % 8;
    std::vector<Placement> ps;
    for (int m = 0; m < mesh_nd; ++m)
      ps.push_back(rng() % 2 ? Placement(Shard{static_cast<std::int64_t>(rng() % nd)}) : Replicate{});
    Layout l(ps);
    BOOST_TEST_CONTEXT("seed " << seed << " iter " << iter << " mesh " << fmt::format("{}", mesh) << " shape "
                               << fmt::format("{}", shape) << " layout " << fmt::format("{}", l)) {
      std::set<std::vector<std::int64_t>> seen;
      std::int64_t covered = 0;
      for (std::int64_t r = 0; r < numel(mesh); ++r) {
        Shape c = unravel_index(r, mesh);
        bool axis = true;
        for (int m = 0; m < mesh_nd; ++m)
          if (!is_shard(ps[m]) && c[m] != 0) axis = false;
        if (!axis) continue;
        Box b = local_box(mesh, shape, l, c);
        covered += b.numel();
        BOOST_TEST(contains(full_box(shape), b));
      }
      BOOST_TEST(covered == numel(shape));
    }
  }
}

BOOST_AUTO_TEST_CASE(box_subtract_is_exact) {
  const unsigned seed = 7;
  std::mt19937 rng(seed);
  for (int iter = 0; iter < 300; ++iter) {
    int nd = 1 + rng() % 3;
    Box a{Shape(nd), Shape(nd)}, b{Shape(nd), Shape(nd)};
    for (int d = 0; d < nd; ++d) {
      a.offset[d] = rng() % 4, a.size[d] = rng() % 4;
      b.offset[d] = rng() % 4, b.size[d] = rng() % 4;
    }
    BOOST_TEST_CONTEXT("seed " << seed << " iter " << iter << " a " << fmt::format("{}", a) << " b "
                               << fmt::format("{}", b)) {
      auto pieces = subtract(a, b);
      std::int64_t total = 0;
      for (auto& p : pieces) {
        total += p.numel();
        BOOST_TEST(contains(a, p));
        BOOST_TEST(intersect(p, b).empty());
      }
      BOOST_TEST(total == a.numel() - intersect(a, b).numel());
      for (std::size_t i = 0; i < pieces.size(); ++i)
        for (std::size_t j = i + 1; j < pieces.size(); ++j) BOOST_TEST(intersect(pieces[i], pieces[j]).empty());
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(tensor)

BOOST_AUTO_TEST_CASE(basics) {
  Tensor t = Tensor::arange({2, 3}, DType::Float64);
  BOOST_TEST(t.numel() == 6);
  BOOST_TEST(t.size(-1) == 3);
  BOOST_TEST(t.get({1, 2}) == 5.0);
  t.set({0, 0}, 42);
  BOOST_TEST(t.get({0, 0}) == 42.0);
  Tensor c = t.clone();
  c.set({0, 0}, 1);
  BOOST_TEST(t.get({0, 0}) == 42.0);
  BOOST_TEST(!equal(t, c));
  BOOST_TEST(allclose(Tensor::full({3}, 1.0), Tensor::full({3}, 1.0 + 1e-9)));
  BOOST_TEST(!allclose(Tensor::full({3}, 1.0), Tensor::full({3}, 1.1)));
  check_throws<ShapeError>([&] { t.get({2, 0}); }, "index 2 out of range");
  check_throws<DTypeError>([&] { t.data_as<float>(); }, "data_as<f32> on a f64 tensor");
  check_throws<ShapeError>([] { Tensor::zeros({2, -1}); }, "-1");
  // 16-bit floats are stored on the CPU and read back as doubles.
  BOOST_TEST(Tensor::ones({2}, DType::BFloat16).get({1}) == 1.0);
  check_throws<DTypeError>([] { Tensor::ones({2}, DType::BFloat16).data_as<float>(); },
                           "data_as<f32> on a bf16 tensor");
  BOOST_TEST(fmt::format("{}", Tensor::arange({3}, DType::Int64)) == "Tensor(3, i64, [0, 1, 2])");
}

BOOST_AUTO_TEST_CASE(random_regions_match_the_full_tensor) {
  for (DType dt : {DType::Float32, DType::Float64, DType::Int64}) {
    Tensor full = Tensor::rand({5, 7, 3}, dt, 1234);
    Tensor again = Tensor::rand({5, 7, 3}, dt, 1234);
    BOOST_TEST(equal(full, again));
    BOOST_TEST(!equal(full, Tensor::rand({5, 7, 3}, dt, 1235)));
    Box box{{1, 2, 0}, {3, 4, 2}};
    Tensor part = Tensor::empty(box.size, dt);
    fill_random(part, 1234, full.shape(), box.offset);
    BOOST_TEST(equal(part, slice_box(full, box)));
  }
}

BOOST_AUTO_TEST_CASE(pack_unpack_and_copy_boxes) {
  Tensor t = Tensor::arange({4, 5, 6}, DType::Float32);
  Box box{{1, 0, 2}, {2, 5, 3}};
  std::vector<std::byte> buf(box.numel() * 4);
  pack_box(t, box, buf.data());
  Tensor u = Tensor::zeros({4, 5, 6}, DType::Float32);
  unpack_box(buf.data(), u, box);
  BOOST_TEST(equal(slice_box(u, box), slice_box(t, box)));
  BOOST_TEST(slice_box(t, box).get({1, 4, 2}) == t.get({2, 4, 4}));
  Tensor dst = Tensor::zeros({3, 6, 4}, DType::Float32);
  std::vector<std::int64_t> at{1, 1, 1};
  copy_box(t, box, dst, at);
  BOOST_TEST(dst.get({1, 1, 1}) == t.get({1, 0, 2}));
  check_throws<ShapeError>([&] { slice_box(t, Box{{3, 0, 0}, {2, 1, 1}}); }, "does not fit");
}

BOOST_AUTO_TEST_CASE(copy_into_writes_the_shared_storage) {
  Tensor dst = Tensor::zeros({2, 3}, DType::Float64);
  Tensor alias = dst;  // shares storage
  const Tensor src = Tensor::arange({2, 3}, DType::Float64);
  copy_into(src, dst);
  BOOST_TEST(equal(alias, src));
  Tensor empty_dst = Tensor::zeros({0, 3}, DType::Float64);
  copy_into(Tensor::zeros({0, 3}, DType::Float64), empty_dst);
  check_throws<ShapeError>([&] { copy_into(Tensor::zeros({3, 2}, DType::Float64), dst); }, "shape 3x2 to shape 2x3");
  check_throws<DTypeError>([&] { copy_into(Tensor::zeros({2, 3}, DType::Float32), dst); }, "from f32 to f64");
}

BOOST_AUTO_TEST_CASE(reductions) {
  std::vector<double> a{1, 5, 3}, b{4, 2, 3};
  auto run = [&](ReduceOp op) {
    std::vector<double> acc = a;
    reduce_into(acc.data(), b.data(), 3, DType::Float64, op);
    return acc;
  };
  BOOST_TEST(run(ReduceOp::Sum) == std::vector<double>({5, 7, 6}));
  BOOST_TEST(run(ReduceOp::Max) == std::vector<double>({4, 5, 3}));
  BOOST_TEST(run(ReduceOp::Min) == std::vector<double>({1, 2, 3}));
}

// Big CPU blocks come back from the cache for the next tensor of the same
// size (their pages stay mapped), smaller ones and other sizes do not mix,
// and a cached block never aliases a live tensor.
BOOST_AUTO_TEST_CASE(big_host_blocks_are_reused) {
  namespace hb = dtensor::host_blocks;
  const Shape big{1024, 1024};  // 4 MiB of f32
  const auto before = hb::stats();
  const void* first = nullptr;
  {
    Tensor a = Tensor::full(big, 3.0);
    first = a.data();
  }
  Tensor b = Tensor::empty(big);
  BOOST_TEST(b.data() == first);
  BOOST_TEST(hb::stats().hits >= before.hits + 1);
  Tensor c = Tensor::zeros(big);  // b is alive: c gets another block, zeroed
  BOOST_TEST(c.data() != b.data());
  BOOST_TEST(c.get({1023, 1023}) == 0.0);
  Tensor other = Tensor::empty({1024, 1040});  // 64 KiB more: the next size class
  BOOST_TEST(other.data() != first);
  BOOST_TEST(hb::stats().bytes_cached <= hb::kHostCacheBytes);
}

// Tensor::to(bf16)'s loop rounds as bfloat16(float) does, bit for bit:
// ties to even, overflow to inf, NaN kept quiet, on random bit patterns and
// the special ones.
BOOST_AUTO_TEST_CASE(float_to_bf16_matches_the_scalar_rounding) {
  const unsigned seed = 20261201;
  std::mt19937 rng(seed);
  std::vector<std::uint32_t> patterns{0u,          0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u,
                                      0xffffffffu, 0x7f7fffffu, 0x00000001u, 0x3f808000u, 0x3f818000u, 0x3f80ffffu};
  for (int i = 0; i < 100000; ++i) patterns.push_back(static_cast<std::uint32_t>(rng()));
  std::vector<float> values(patterns.size());
  std::memcpy(values.data(), patterns.data(), patterns.size() * sizeof(float));
  const Tensor t = Tensor::from_vector(values, {static_cast<std::int64_t>(values.size())}).to(DType::BFloat16);
  const auto* got = t.data_as<dtensor::bfloat16>();
  int bad = 0;
  for (std::size_t i = 0; i < values.size(); ++i)
    if (got[i].bits != dtensor::bfloat16(values[i]).bits && ++bad <= 3)
      BOOST_ERROR("seed " << seed << " pattern 0x" << std::hex << patterns[i] << ": 0x" << got[i].bits
                          << " instead of 0x" << dtensor::bfloat16(values[i]).bits);
  BOOST_TEST(bad == 0, "seed " << seed);
}

BOOST_AUTO_TEST_SUITE_END()
