// The CUDA device of the ground types, and the 16-bit dtypes everywhere.
// Runs on any machine:
//   - the caching allocator over a counting block source (reuse per stream,
//     rounding, the 2x rule, emptying, retry after an out-of-memory);
//   - bf16/f16 rounding against known bit patterns;
//   - bf16/f16 tensors on the CPU (conversion, seeded values, a sharded
//     reduction over thread ranks);
//   - what a build or machine without a GPU says when asked for one.
// Needs a GPU (skipped, and counted as skipped, without one): host/device
// round trips, seeded values bitwise equal to the CPU's, device box copies
// against the host ones, the allocator serving repeated tensors from its
// pool, and simulated GPU ranks running collectives and a redistribution.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <limits>
#include <map>
#include <random>

#include <dtensor/dtensor.h>

#include "dtensor/core/detail/caching_allocator.h"
#include "dtensor/core/cuda.h"
#include "support.h"

using namespace dtensor;
namespace utf = boost::unit_test;

namespace cuda_test {

// A block source that hands out fake addresses and counts its calls.
struct CountingSource {
  std::map<void*, std::size_t> live;
  std::size_t next = 0x1000, allocs = 0, releases = 0, capacity = std::numeric_limits<std::size_t>::max();
  std::size_t used = 0;
  CachingAllocator make() {
    return CachingAllocator(
        [this](std::size_t bytes) -> void* {
          if (used + bytes > capacity) return nullptr;
          void* p = reinterpret_cast<void*>(next);
          next += bytes + 0x1000;
          live[p] = bytes;
          used += bytes;
          ++allocs;
          return p;
        },
        [this](void* p) {
          used -= live.at(p);
          live.erase(p);
          ++releases;
        });
  }
};

// Streams are opaque keys to the allocator: two distinct addresses.
const int stream_tokens[2] = {0, 0};
const void* stream_a = &stream_tokens[0];
const void* stream_b = &stream_tokens[1];

}  // namespace cuda_test
using namespace cuda_test;

BOOST_AUTO_TEST_SUITE(caching_allocator)

BOOST_AUTO_TEST_CASE(a_freed_block_serves_the_next_request_of_its_size_on_its_stream) {
  CountingSource src;
  auto a = src.make();
  void* p = a.allocate(1000, stream_a);
  BOOST_TEST(src.allocs == 1u);
  a.free(p);
  void* q = a.allocate(900, stream_a);  // rounds to the same 1024 bytes
  BOOST_TEST(q == p);
  BOOST_TEST(src.allocs == 1u);
  BOOST_TEST(a.stats().cache_hits == 1u);
  a.free(q);
  // Another stream never gets it: work queued there could race with this one's.
  void* r = a.allocate(1000, stream_b);
  BOOST_TEST(r != p);
  BOOST_TEST(src.allocs == 2u);
  a.free(r);
}

BOOST_AUTO_TEST_CASE(sizes_round_to_512_bytes_below_a_mebibyte_and_2_mib_above) {
  BOOST_TEST(CachingAllocator::round_size(0) == 512u);
  BOOST_TEST(CachingAllocator::round_size(1) == 512u);
  BOOST_TEST(CachingAllocator::round_size(513) == 1024u);
  BOOST_TEST(CachingAllocator::round_size((1u << 20) - 1) == (1u << 20));
  BOOST_TEST(CachingAllocator::round_size((1u << 20) + 1) == (2u << 20));
  BOOST_TEST(CachingAllocator::round_size((5u << 20) + 7) == (6u << 20));
}

BOOST_AUTO_TEST_CASE(a_small_request_does_not_pin_a_block_more_than_twice_its_size) {
  CountingSource src;
  auto a = src.make();
  void* big = a.allocate(64 << 20, stream_a);
  a.free(big);
  void* small = a.allocate(1 << 10, stream_a);
  BOOST_TEST(small != big);
  void* half = a.allocate(40 << 20, stream_a);  // 40 MiB of a 64 MiB block: within 2x
  BOOST_TEST(half == big);
  BOOST_TEST(a.stats().bytes_in_use == CachingAllocator::round_size(1 << 10) + (64u << 20));
  a.free(small);
  a.free(half);
  BOOST_TEST(a.stats().bytes_in_use == 0u);
}

BOOST_AUTO_TEST_CASE(empty_cache_releases_free_blocks_and_out_of_memory_retries_after_releasing) {
  CountingSource src;
  src.capacity = 10 << 20;
  auto a = src.make();
  void* p = a.allocate(6 << 20, stream_a);
  a.free(p);
  BOOST_TEST(a.stats().bytes_cached == (6u << 20));
  // 8 MiB does not fit beside the cached 6 MiB: the pool is released and
  // the source asked again.
  void* q = a.allocate(8 << 20, stream_a);
  BOOST_TEST(q != nullptr);
  BOOST_TEST(src.releases == 1u);
  BOOST_TEST(a.stats().bytes_cached == 0u);
  // Nothing left to release: the request fails with nullptr, no exception.
  BOOST_TEST(a.allocate(4 << 20, stream_a) == nullptr);
  a.free(q);
  a.empty_cache();
  BOOST_TEST(src.live.empty());
}

BOOST_AUTO_TEST_CASE(freeing_a_foreign_or_freed_pointer_is_an_error) {
  CountingSource src;
  auto a = src.make();
  void* p = a.allocate(10, stream_a);
  a.free(p);
  BOOST_CHECK_THROW(a.free(p), ValueError);
  int x = 0;
  BOOST_CHECK_THROW(a.free(&x), ValueError);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(half_types)

BOOST_AUTO_TEST_CASE(bfloat16_rounds_to_nearest_even_and_keeps_nans) {
  BOOST_TEST(bfloat16(1.0f).bits == 0x3f80);
  BOOST_TEST(bfloat16(-2.0f).bits == 0xc000);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even 1.
  BOOST_TEST(bfloat16(1.0f + 1.0f / 256).bits == 0x3f80);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6: rounds up to even.
  BOOST_TEST(bfloat16(1.0f + 3.0f / 256).bits == 0x3f82);
  BOOST_TEST(std::isnan(static_cast<float>(bfloat16(std::nanf("")))));
  BOOST_TEST(std::isinf(static_cast<float>(bfloat16(std::numeric_limits<float>::max()))));
  BOOST_TEST(static_cast<float>(bfloat16(3.140625f)) == 3.140625f);
}

BOOST_AUTO_TEST_CASE(float16_rounds_to_nearest_even_with_subnormals_and_overflow) {
  BOOST_TEST(float16(1.0f).bits == 0x3c00);
  BOOST_TEST(float16(-2.0f).bits == 0xc000);
  BOOST_TEST(float16(65504.0f).bits == 0x7bff);                      // the largest half
  BOOST_TEST(float16(65519.0f).bits == 0x7bff);                      // below the rounding point
  BOOST_TEST(float16(65520.0f).bits == 0x7c00);                      // rounds to inf
  BOOST_TEST(float16(std::ldexp(1.0f, -24)).bits == 0x0001);         // smallest subnormal
  BOOST_TEST(float16(std::ldexp(1.0f, -25)).bits == 0x0000);         // a tie: to even (zero)
  BOOST_TEST(float16(std::ldexp(3.0f, -25)).bits == 0x0002);         // 1.5 ulps: to even (2)
  BOOST_TEST(float16(std::ldexp(1.0f, -14)).bits == 0x0400);         // smallest normal
  BOOST_TEST(float16(1.0f + std::ldexp(1.0f, -11)).bits == 0x3c00);  // tie to even
  BOOST_TEST(float16(1.0f + std::ldexp(3.0f, -11)).bits == 0x3c02);
  BOOST_TEST((float16(std::nanf("")).bits & 0x7c00) == 0x7c00);
  // Every finite half survives a round trip through float.
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const float16 h = float16::from_bits(static_cast<std::uint16_t>(b));
    if ((b & 0x7c00) == 0x7c00) continue;
    BOOST_TEST_REQUIRE(float16(static_cast<float>(h)).bits == h.bits, "half bits " << b);
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(sixteen_bit_tensors_on_the_cpu)

BOOST_AUTO_TEST_CASE(conversion_and_seeded_values_are_the_f32_ones_rounded) {
  const Tensor f = Tensor::rand({5, 7}, DType::Float32, 42);
  for (DType d : {DType::BFloat16, DType::Float16}) {
    const Tensor h = Tensor::rand({5, 7}, d, 42);
    BOOST_TEST(equal(h, f.to(d)), "rand in " << dtype_name(d));
    BOOST_TEST(equal(Tensor::randn({3, 4}, d, 7), Tensor::randn({3, 4}, DType::Float32, 7).to(d)),
               "randn in " << dtype_name(d));
    BOOST_TEST(allclose(h.to(DType::Float32), f, d == DType::BFloat16 ? 4e-3 : 5e-4, 0),
               "round trip in " << dtype_name(d));
    BOOST_TEST(h.get({1, 2}) == f.to(d).get({1, 2}));
  }
  Tensor t = Tensor::zeros({2}, DType::BFloat16);
  t.set({1}, 1.5);
  BOOST_TEST(t.get({1}) == 1.5);
  BOOST_TEST(fmt::format("{}", t) == "Tensor(2, bf16, [0, 1.5])");
}

BOOST_AUTO_TEST_CASE(ops_compute_bf16_in_f32_and_round_once) {
  const Tensor a = Tensor::randn({4, 8}, DType::BFloat16, 1), b = Tensor::randn({8, 3}, DType::BFloat16, 2);
  const Tensor want = matmul(a.to(DType::Float32), b.to(DType::Float32)).to(DType::BFloat16);
  const Tensor got = matmul(a, b);
  BOOST_TEST((got.dtype() == DType::BFloat16));
  BOOST_TEST(equal(got, want));
  const Tensor s = softmax(a, 1);
  BOOST_TEST(equal(s, softmax(a.to(DType::Float32), 1).to(DType::BFloat16)));
}

BOOST_AUTO_TEST_CASE(a_sharded_bf16_matmul_reduces_its_partial_sum_in_bf16) {
  const Tensor a = testing::integer_tensor({4, 8}, DType::Float32, 3).to(DType::BFloat16);
  const Tensor b = Tensor::ones({8, 4}, DType::BFloat16);
  // Integer inputs below 2^8 summed over 8 terms stay exact in bf16 up to 256.
  const Tensor want = matmul(a.to(DType::Float32), b.to(DType::Float32));
  std::vector<std::string> failures;
  testing::run_ranks(4, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {4});
    const DTensor da = distribute_tensor(a, mesh, Layout::parse("S(1)"));
    const DTensor db = distribute_tensor(b, mesh, Layout::parse("S(0)"));
    const DTensor c = matmul(da, db);
    const Tensor full = c.full_tensor();
    if (testing::reports_results(comm) && !allclose(full.to(DType::Float32), want, 1e-2, 1.0))
      failures.push_back(
          fmt::format("bf16 matmul over 4 ranks: max |diff| {}", max_abs_diff(full.to(DType::Float32), want)));
  });
  testing::check_no_failures(failures);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(without_a_gpu)

BOOST_AUTO_TEST_CASE(asking_for_a_cuda_tensor_names_what_is_missing) {
  if (cuda::device_count() > 0) {
    BOOST_TEST_MESSAGE("a GPU is present: the missing-device errors cannot be observed here");
    BOOST_TEST(cuda::built());
    return;
  }
  try {
    (void)Tensor::empty({2}, DType::Float32, Device::CUDA);
    BOOST_FAIL("a CUDA tensor was made without a device");
  } catch (const UnsupportedError& e) {
    BOOST_TEST(!cuda::built());
    BOOST_TEST(std::string(e.what()).find("-Dcuda=enabled") != std::string::npos, e.what());
  } catch (const DeviceError& e) {
    BOOST_TEST(cuda::built());
    BOOST_TEST(std::string(e.what()).find("needs a CUDA device") != std::string::npos, e.what());
  }
  ThreadsOptions options;
  options.device = Device::CUDA;
  BOOST_CHECK_THROW(run_threads(
                        2, [](Communicator&) {}, options),
                    Error);
  BOOST_TEST(cuda::allocator_stats().device_allocations == 0u);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(on_a_gpu, *utf::precondition(testing::needs_gpu))

BOOST_AUTO_TEST_CASE(host_device_round_trips_and_seeded_values_match_the_cpu) {
  BOOST_TEST_MESSAGE("device: " << cuda::describe_device());
  for (DType d : {DType::Float32, DType::Float64, DType::Int64, DType::BFloat16, DType::Float16}) {
    const Tensor host = Tensor::rand({33, 17}, d, 9);
    const Tensor dev = host.to(Device::CUDA);
    BOOST_TEST((dev.device() == Device::CUDA));
    BOOST_TEST(equal(dev.to(Device::CPU), host), "round trip " << dtype_name(d));
    BOOST_TEST(equal(Tensor::rand({33, 17}, d, 9, Device::CUDA), host), "rand " << dtype_name(d));
    BOOST_TEST(equal(Tensor::arange({5, 6}, d, Device::CUDA), Tensor::arange({5, 6}, d)), "arange " << dtype_name(d));
    BOOST_TEST(equal(Tensor::full({4}, 2.5, d, Device::CUDA), Tensor::full({4}, 2.5, d)), "full " << dtype_name(d));
    BOOST_TEST(equal(host.to(Device::CUDA).to(DType::Float32), host.to(DType::Float32)), "cast " << dtype_name(d));
    if (is_floating(d))
      BOOST_TEST(allclose(Tensor::randn({33, 17}, d, 9, Device::CUDA), Tensor::randn({33, 17}, d, 9), 1e-6, 1e-7),
                 "randn " << dtype_name(d));
  }
}

BOOST_AUTO_TEST_CASE(device_box_copies_match_the_host_ones) {
  std::mt19937_64 rng(2024);
  BOOST_TEST_MESSAGE("seed 2024");
  for (int trial = 0; trial < 200; ++trial) {
    const int nd = 1 + static_cast<int>(rng() % 4);
    Shape shape(nd), off(nd), size(nd);
    for (int d = 0; d < nd; ++d) {
      shape[d] = 1 + static_cast<std::int64_t>(rng() % 6);
      off[d] = static_cast<std::int64_t>(rng() % shape[d]);
      size[d] = static_cast<std::int64_t>(rng() % (shape[d] - off[d] + 1));
    }
    const Box box{off, size};
    const Tensor host = Tensor::arange(shape, DType::Float64);
    const Tensor dev = host.to(Device::CUDA);
    BOOST_TEST_REQUIRE(equal(slice_box(dev, box).to(Device::CPU), slice_box(host, box)),
                       "trial " << trial << " shape " << fmt::format("{}", fmt::join(shape, "x")) << " box "
                                << fmt::format("{}", box));
  }
}

BOOST_AUTO_TEST_CASE(repeated_tensors_come_from_the_pool) {
  (void)Tensor::empty({1 << 20}, DType::Float32, Device::CUDA);
  const auto before = cuda::allocator_stats();
  for (int i = 0; i < 100; ++i) (void)Tensor::empty({1 << 20}, DType::Float32, Device::CUDA);
  const auto after = cuda::allocator_stats();
  BOOST_TEST(after.device_allocations == before.device_allocations);
  BOOST_TEST(after.cache_hits - before.cache_hits == 100u);
}

BOOST_AUTO_TEST_CASE(simulated_gpu_ranks_run_collectives_and_redistributions) {
  const Tensor full = testing::integer_tensor({8, 12}, DType::Float32, 5);
  std::vector<std::string> failures;
  ThreadsOptions options;
  options.device = Device::CUDA;
  run_threads(
      4,
      [&](Communicator& comm) {
        BOOST_TEST((comm.device() == Device::CUDA));
        DeviceMesh mesh(comm, {2, 2});
        for (const char* from : {"S(0),S(1)", "R,S(0)", "P(sum),R", "S(1),P(max)"}) {
          for (const char* to : {"R,R", "S(1),S(0)", "S(0),R"}) {
            if (std::string(from).find('P') != std::string::npos) continue;  // sources below
            const DTensor x = distribute_tensor(full, mesh, Layout::parse(from));
            const DTensor y = x.redistribute(Layout::parse(to));
            const Tensor got = y.full_tensor().to(Device::CPU);
            if (testing::reports_results(comm) && !equal(got, full))
              failures.push_back(
                  fmt::format("{} -> {} on simulated GPU ranks: max |diff| {}", from, to, max_abs_diff(got, full)));
          }
        }
        // A Partial(sum) made by a sharded matmul, reduced on the device.
        const Tensor a = testing::integer_tensor({6, 8}, DType::Float32, 6);
        const Tensor b = testing::integer_tensor({8, 5}, DType::Float32, 7);
        const DTensor c = matmul(distribute_tensor(a, mesh, Layout::parse("R,S(1)")),
                                 distribute_tensor(b, mesh, Layout::parse("R,S(0)")));
        const Tensor got = c.full_tensor().to(Device::CPU);
        if (testing::reports_results(comm) && !allclose(got, matmul(a, b), 0, 0))
          failures.push_back(
              fmt::format("matmul over simulated GPU ranks: max |diff| {}", max_abs_diff(got, matmul(a, b))));
      },
      options);
  testing::check_no_failures(failures);
}

BOOST_AUTO_TEST_SUITE_END()
