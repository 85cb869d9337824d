// Memory under load: the per-thread plan and propagation caches stay within
// their bound however many distinct shapes a program sees (and still give
// right answers after evicting), and the CPU allocator keeps resident
// memory within about twice the live tensor bytes on several rank threads,
// and gives its cache back on request.
#include <boost/test/unit_test.hpp>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>

#include "dtensor/core/memory_account.h"
#include "dtensor/core/units.h"
#include "dtensor/core/detail/cache_capacity.h"
#include "dtensor/core/detail/host_blocks.h"
#include "support.h"

namespace utf = boost::unit_test;
using namespace dtensor;
using dtensor::testing::FailureLog;

namespace {

constexpr unsigned kSeed = 20261201;

double rss_mib() { return static_cast<double>(resident_bytes()) / (1 << 20); }

// AddressSanitizer keeps freed memory in quarantine and maps shadow memory,
// so resident memory says nothing about the allocator there.
boost::test_tools::assertion_result rss_is_meaningful(utf::test_unit_id) {
#if defined(__SANITIZE_ADDRESS__)
  boost::test_tools::assertion_result ok(false);
  ok.message() << "skipped under AddressSanitizer (its quarantine and shadow memory change RSS)";
  return ok;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  boost::test_tools::assertion_result ok(false);
  ok.message() << "skipped under AddressSanitizer (its quarantine and shadow memory change RSS)";
  return ok;
#else
  return true;
#endif
#else
  return true;
#endif
}

// Restores both cache bounds when a case ends, however it ends.
struct CacheBounds {
  CacheBounds(std::size_t plans, std::size_t propagation) {
    set_plan_cache_capacity(plans);
    set_propagation_cache_capacity(propagation);
  }
  ~CacheBounds() {
    set_plan_cache_capacity(kDefaultPlanCacheEntries);
    set_propagation_cache_capacity(kDefaultPropagationCacheEntries);
  }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(caches)

// 4 rank threads see 3x more distinct shapes than either cache holds, twice
// over (the second pass finds every early shape evicted): the entry counts
// never pass the bound, evictions are counted, and every sum is right.
BOOST_AUTO_TEST_CASE(bound_holds_with_many_distinct_shapes) {
  constexpr std::size_t kBound = 16;
  constexpr std::int64_t kShapes = 48;
  const CacheBounds bounds(kBound, kBound);
  FailureLog log;
  run_threads(4, [&](Communicator& comm) {
    clear_plan_cache();
    clear_propagation_cache();
    DeviceMesh mesh(comm, {2, 2});
    std::size_t most_plans = 0, most_entries = 0;
    for (int pass = 0; pass < 2; ++pass)
      for (std::int64_t n = 1; n <= kShapes; ++n) {
        // A different length each time: one propagation entry (the add)
        // and one plan (to R,R) per shape.
        const Tensor full = Tensor::arange({4 * n}, DType::Float32);
        DTensor x = distribute_tensor(comm.rank() == 0 ? full : Tensor(), mesh, Layout::parse("S(0),R"));
        const Tensor got = (x + x).redistribute(Layout::parse("R,R")).to_local();
        for (std::int64_t i = 0; i < 4 * n; i += 7)
          if (got.get({i}) != 2.0 * static_cast<double>(i))
            log.add(fmt::format("seed {} rank {} pass {} shape {}: element {} is {}, expected {}", kSeed, comm.rank(),
                                pass, 4 * n, i, got.get({i}), 2 * i));
        most_plans = std::max(most_plans, plan_cache_stats().entries);
        most_entries = std::max(most_entries, propagation_cache_stats().entries);
      }
    const auto plans = plan_cache_stats();
    const auto props = propagation_cache_stats();
    if (most_plans > kBound || most_entries > kBound || plans.capacity != kBound || props.capacity != kBound)
      log.add(fmt::format("rank {}: held up to {} plans and {} propagation entries; the bound is {} (reported {}, {})",
                          comm.rank(), most_plans, most_entries, kBound, plans.capacity, props.capacity));
    // Every shape of the second pass missed (its plan was evicted in the
    // first), so each cache evicted all but kBound of 2 * kShapes inserts.
    if (plans.evictions < 2 * kShapes - kBound || props.evictions < 2 * kShapes - kBound)
      log.add(fmt::format("rank {}: {} plan and {} propagation evictions, expected at least {}", comm.rank(),
                          plans.evictions, props.evictions, 2 * kShapes - kBound));
    if (plans.bytes == 0 || props.bytes == 0 || plans.entries == 0)
      log.add(fmt::format("rank {}: caches report {} and {} bytes for {} and {} entries", comm.rank(), plans.bytes,
                          props.bytes, plans.entries, props.entries));
    clear_plan_cache();
    clear_propagation_cache();
  });
  dtensor::testing::check_no_failures(log.failures);
}

// A hit keeps its entry: the most recently used survive a stream of others.
BOOST_AUTO_TEST_CASE(recently_used_entries_survive) {
  const CacheBounds bounds(4, 4);
  clear_plan_cache();
  auto request = [](std::int64_t n) {
    return PlanRequest{{4}, {4 * n}, DType::Float32, Layout::parse("S(0)"), Layout::parse("R"), CostModel{}};
  };
  const PlanRequest hot = request(1000);
  const Plan first = cached_plan(hot);
  for (std::int64_t n = 1; n <= 20; ++n) {
    cached_plan(request(n));
    BOOST_TEST((cached_plan(hot) == first));  // touched: never the oldest
  }
  const auto s = plan_cache_stats();
  BOOST_TEST(s.entries == 4u);
  BOOST_TEST(s.misses == 21u);  // the hot request missed once
  BOOST_TEST(s.evictions == 17u);
  clear_plan_cache();
}

// Big plans (exchanges on 256 ranks: hundreds of KiB each) are bounded by
// bytes too, well before the entry bound.
BOOST_AUTO_TEST_CASE(big_plans_are_bounded_by_bytes) {
  clear_plan_cache();
  for (std::int64_t n = 1; n <= 200; ++n) {
    cached_plan(PlanRequest{{4, 4, 4, 4},
                            {1000 + n, 1001},
                            DType::Float32,
                            Layout::parse("P(sum),P(sum),R,R"),
                            Layout::parse("S(0),S(1),R,R"),
                            CostModel{}});
    BOOST_TEST_REQUIRE(plan_cache_stats().bytes <= kPlanCacheBytes);
  }
  BOOST_TEST(plan_cache_stats().evictions > 0u);
  clear_plan_cache();
}

BOOST_AUTO_TEST_CASE(bounds_are_range_checked) {
  for (std::size_t bad : {std::size_t{0}, kMaxCacheEntries + 1}) {
    BOOST_CHECK_EXCEPTION(set_plan_cache_capacity(bad), ValueError, [&](const ValueError& e) {
      return std::string(e.what()).find(std::to_string(bad)) != std::string::npos;
    });
    BOOST_CHECK_THROW(set_propagation_cache_capacity(bad), ValueError);
  }
  BOOST_TEST(plan_cache_stats().capacity == kDefaultPlanCacheEntries);
  // The environment variable, read on first use.
  ::setenv("DTENSOR_TEST_CACHE_ENTRIES", "12x", 1);
  const CacheCapacity bad("DTENSOR_TEST_CACHE_ENTRIES", 5, "test cache");
  BOOST_CHECK_EXCEPTION(bad.get(), ValueError, [](const ValueError& e) {
    const std::string m = e.what();
    return m.find("DTENSOR_TEST_CACHE_ENTRIES='12x'") != std::string::npos && m.find("1 to") != std::string::npos;
  });
  ::setenv("DTENSOR_TEST_CACHE_ENTRIES", "7", 1);
  const CacheCapacity seven("DTENSOR_TEST_CACHE_ENTRIES", 5, "test cache");
  BOOST_TEST(seven.get() == 7u);
  ::unsetenv("DTENSOR_TEST_CACHE_ENTRIES");
  const CacheCapacity unset("DTENSOR_TEST_CACHE_ENTRIES", 5, "test cache");
  BOOST_TEST(unset.get() == 5u);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(host_memory)

// A block freed on another thread than the one that allocated it goes back
// to the one pool, and serves the next request of its class anywhere.
BOOST_AUTO_TEST_CASE(blocks_freed_on_other_threads) {
  const auto before = host_memory_stats();
  std::vector<Tensor> made(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back([&, i] { made[i] = Tensor::full({1 << 20}, 1.0 + i); });
  for (auto& t : threads) t.join();
  threads.clear();
  for (int i = 0; i < 4; ++i) threads.emplace_back([&, i] { made[3 - i] = Tensor(); });
  for (auto& t : threads) t.join();
  const auto after = host_memory_stats();
  BOOST_TEST(after.bytes_in_use == before.bytes_in_use);
  const Tensor again = Tensor::zeros({1 << 20});
  BOOST_TEST(host_memory_stats().hits >= after.hits + 1);
  BOOST_TEST(again.get({(1 << 20) - 1}) == 0.0);
  BOOST_TEST(host_blocks::class_size((4 << 20) + 1) == (4u << 20) + (512u << 10));
  BOOST_TEST(host_blocks::class_size(std::size_t{3} << 20) == std::size_t{3} << 20);
}

// A budget: an allocation that would hold more than it in use is an
// OutOfBudget naming the owner, the bytes asked for, those it would hold,
// the budget and the peak, and takes nothing; up to the budget exactly is
// allowed; 0 lifts it. DTENSOR_MEMORY_BUDGET's text parses as parse_bytes.
BOOST_AUTO_TEST_CASE(a_budget_refuses_what_would_pass_it) {
  auto account = std::make_shared<MemoryAccount>();
  account->set_budget(1000, "rank 3");
  const ChargeMemoryTo charge(account);
  const Tensor first = Tensor::empty({100}, DType::Float64);  // 800 bytes
  testing::check_throws<OutOfBudget>(
      [] { (void)Tensor::empty({26}, DType::Float64); },
      "[memory] rank 3: 208 B more would hold 1008 B in use, past the budget of 1000 B (1000 bytes); the peak so far "
      "800 B");
  BOOST_TEST(account->bytes_in_use() == 800u);
  const Tensor exactly = Tensor::empty({25}, DType::Float64);  // 200 bytes: 1000 in all
  BOOST_TEST(account->bytes_in_use() == 1000u);
  account->set_budget(0, "rank 3");
  const Tensor beyond = Tensor::empty({1000}, DType::Float64);
  BOOST_TEST(account->bytes_in_use() == 9000u);
}

BOOST_AUTO_TEST_CASE(byte_counts_parse_as_people_write_them) {
  using Bytes = std::int64_t;
  for (const auto& [text, bytes] :
       {std::pair{"4096", Bytes{4096}}, std::pair{"4096B", Bytes{4096}}, std::pair{"512MiB", Bytes{512} << 20},
        std::pair{"1.5 GiB", Bytes{3} << 29}, std::pair{"2GB", Bytes{2'000'000'000}},
        std::pair{"300 mb", Bytes{300'000'000}}, std::pair{"1kib", Bytes{1024}}, std::pair{"0.5KiB", Bytes{512}}})
    BOOST_TEST(parse_bytes(text) == bytes, text);
  for (const char* bad : {"", "MiB", "12XB", "-5MiB", "1.2.3", "1e3", "99999999999TiB", "5 Mi B"})
    testing::check_throws<ParseError>([&] { (void)parse_bytes(bad); },
                                      fmt::format("[units] '{}' is not a byte count", bad));
  ::setenv("DTENSOR_MEMORY_BUDGET", "64KiB", 1);
  BOOST_TEST(memory_budget_from_environment().value_or(0) == 65536u);
  ::setenv("DTENSOR_MEMORY_BUDGET", "lots", 1);
  testing::check_throws<ParseError>([] { (void)memory_budget_from_environment(); },
                                    "[memory] DTENSOR_MEMORY_BUDGET: [units] 'lots' is not a byte count");
  ::unsetenv("DTENSOR_MEMORY_BUDGET");
  BOOST_TEST(!memory_budget_from_environment());
}

// Thread ranks each see their own bytes: a thread's account is charged what
// it allocates (small and big, in the bytes asked for) and uncharged when
// the storage is freed on any thread; views charge nothing; guards nest.
BOOST_AUTO_TEST_CASE(accounts_charge_their_own_threads) {
  auto a = std::make_shared<MemoryAccount>(), b = std::make_shared<MemoryAccount>();
  std::vector<Tensor> kept(2);
  std::thread ta([&] {
    const ChargeMemoryTo charge(a);
    kept[0] = Tensor::zeros({1 << 18}, DType::Float32);  // 1 MiB, a mapped block
    const Tensor small = Tensor::zeros({10}, DType::Float64);
    const Tensor piece = kept[0].view({100}, 1000);
    BOOST_TEST(a->bytes_in_use() == (1u << 20) + 80u);
    {
      const ChargeMemoryTo inner(b);
      kept[1] = Tensor::zeros({3}, DType::Int64);
    }
    const Tensor after = Tensor::zeros({2}, DType::Float32);
    BOOST_TEST(a->bytes_in_use() == (1u << 20) + 88u);
  });
  ta.join();
  BOOST_TEST(a->bytes_in_use() == (1u << 20));
  BOOST_TEST(a->peak_bytes() == (1u << 20) + 88u);
  BOOST_TEST(b->bytes_in_use() == 24u);
  std::thread([&] { kept[0] = Tensor(); }).join();  // freed elsewhere
  BOOST_TEST(a->bytes_in_use() == 0u);
  a->reset_peak();
  BOOST_TEST(a->peak_bytes() == 0u);
  BOOST_TEST(!charged_account());
  const Tensor uncharged = Tensor::zeros({4});
  BOOST_TEST(a->bytes_in_use() == 0u);
}

// A view from an offset shares the storage, keeps it alive, and is checked.
BOOST_AUTO_TEST_CASE(views_from_an_offset) {
  Tensor piece;
  {
    const Tensor whole = Tensor::arange({12}, DType::Float64);
    piece = whole.view({2, 3}, 4);
  }
  BOOST_TEST(piece.get({0, 0}) == 4.0);
  BOOST_TEST(piece.get({1, 2}) == 9.0);
  const Tensor whole = Tensor::arange({12}, DType::Float64);
  BOOST_TEST(whole.view({0}, 12).numel() == 0);
  for (std::int64_t bad : {-1, 11, 13}) {
    BOOST_TEST_CONTEXT("offset " << bad) {
      try {
        (void)whole.view({2}, bad);
        BOOST_ERROR("no ShapeError");
      } catch (const ShapeError& e) {
        BOOST_TEST(std::string(e.what()).find(fmt::format("from element {} of a tensor of 12 elements", bad)) !=
                   std::string::npos, e.what());
      }
    }
  }
}

// A limit of 0 caches nothing; out of range is a ValueError naming it.
BOOST_AUTO_TEST_CASE(limit_is_configurable_and_checked) {
  const std::size_t old = host_memory_stats().limit;
  set_host_cache_limit(0);
  { const Tensor t = Tensor::empty({1 << 20}); }
  BOOST_TEST(host_memory_stats().bytes_cached == 0u);
  set_host_cache_limit(old);
  BOOST_CHECK_EXCEPTION(set_host_cache_limit(std::size_t{2} << 40), ValueError, [](const ValueError& e) {
    return std::string(e.what()).find(std::to_string(std::size_t{2} << 40)) != std::string::npos;
  });
  BOOST_TEST(host_memory_stats().limit == old);
}

// Free blocks are kept while a big tensor is alive (they fit the bound),
// and release_host_memory() gives them back: cached bytes to 0 and the
// resident set down by about as much.
BOOST_AUTO_TEST_CASE(release_returns_memory, *utf::precondition(rss_is_meaningful)) {
  release_host_memory();
  const Tensor big = Tensor::ones({64 << 18});  // 64 MiB in use: 64 MiB may be cached
  {
    std::vector<Tensor> freed;
    for (int i = 0; i < 12; ++i) freed.push_back(Tensor::ones({(4 << 18) + i * 4096}));  // 4 MiB and up
  }
  const auto held = host_memory_stats();
  BOOST_TEST(held.bytes_cached >= 40u << 20);
  const double before = rss_mib();
  release_host_memory();
  const double after = rss_mib();
  BOOST_TEST(host_memory_stats().bytes_cached == 0u);
  BOOST_TEST(before - after >= 0.75 * static_cast<double>(held.bytes_cached) / (1 << 20),
             "RSS " << before << " MiB -> " << after << " MiB with " << (held.bytes_cached >> 20) << " MiB cached");
  BOOST_TEST(big.get({0}) == 1.0);
}

// A step whose size classes peak at different times (activations of one
// size in the forward, gradients of another in the backward) maps more
// blocks than its peak in use; each class's own peak is kept, within twice
// the program's peak, so the same step again maps nothing.
// (Keeping only the room below the peak unmapped 16 blocks a step of the
// 10.9M-parameter GPT.)
BOOST_AUTO_TEST_CASE(blocks_of_classes_peaking_at_different_times_are_kept) {
  release_host_memory();
  const auto step = [] {
    {
      std::vector<Tensor> forward;  // 6 x 20 MiB: the peak, 120 MiB
      for (int i = 0; i < 6; ++i) forward.push_back(Tensor::ones({20 << 18}));
    }
    std::vector<Tensor> backward;  // then 6 x 3 MiB of another class: 138 MiB mapped in all
    for (int i = 0; i < 6; ++i) backward.push_back(Tensor::ones({3 << 18}));
  };
  step();
  const auto after_first = host_memory_stats();
  BOOST_TEST(after_first.peak_bytes_in_use >= 120u << 20);
  BOOST_TEST(after_first.bytes_cached == 138u << 20, (after_first.bytes_cached >> 20) << " MiB cached");
  step();
  const auto after_second = host_memory_stats();
  BOOST_TEST(after_second.misses == after_first.misses,
             after_second.misses - after_first.misses << " blocks mapped again");
  BOOST_TEST(after_second.hits == after_first.hits + 12);
  release_host_memory();
}

// A step's transient blocks, more than what stays in use and than the 64
// MiB floor, are kept for the next step (the room below the peak): the
// same step again maps nothing.
BOOST_AUTO_TEST_CASE(a_steps_blocks_are_kept_for_the_next_step) {
  release_host_memory();
  const auto step = [] {
    std::vector<Tensor> activations;
    for (int i = 0; i < 6; ++i) activations.push_back(Tensor::ones({(20 << 18) + i * 4096}));  // 20 MiB and up: 120
  };
  step();
  const auto after_first = host_memory_stats();
  BOOST_TEST(after_first.bytes_cached >= 120u << 20, (after_first.bytes_cached >> 20) << " MiB cached");
  step();
  const auto after_second = host_memory_stats();
  BOOST_TEST(after_second.misses == after_first.misses,
             after_second.misses - after_first.misses << " blocks mapped again");
  BOOST_TEST(after_second.hits == after_first.hits + 6);
  release_host_memory();
}

// 4 rank threads run steps on shards of a new size each step (1 to 4 MiB),
// keeping the last 3 results: resident memory grows by no more than twice
// the most bytes alive at once plus a fixed allowance (the cache's 64 MiB
// floor and 32 MiB for the heap and the threads' stacks).
BOOST_AUTO_TEST_CASE(steady_state_rss_stays_within_twice_the_live_bytes, *utf::precondition(rss_is_meaningful)) {
  constexpr int kRanks = 4, kKept = 3, kSteps = 40;
  release_host_memory();
  const double start = rss_mib();
  std::atomic<std::int64_t> live{0}, peak_live{0};
  auto track = [&](std::int64_t delta) {
    const std::int64_t now = live += delta;
    std::int64_t p = peak_live.load();
    while (now > p && !peak_live.compare_exchange_weak(p, now)) {
    }
  };
  std::atomic<double> worst_growth{0};
  FailureLog log;
  run_threads(kRanks, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {kRanks});
    std::mt19937 rng(kSeed);  // the same on every rank, so shapes agree
    std::vector<DTensor> kept;
    std::vector<std::int64_t> kept_bytes;
    for (int step = 0; step < kSteps; ++step) {
      const std::int64_t rows = std::uniform_int_distribution<std::int64_t>(256, 1024)(rng);
      const std::int64_t shard = rows * 1024 * 4;
      // At most alive at once here: x, y, y's product, z, w and the
      // collective's send and receive buffers.
      track(7 * shard);
      DTensor x = DTensor::from_local(Tensor::full({rows, 1024}, 1.0 + comm.rank()), mesh, Layout::parse("S(0)"));
      DTensor y = x * x + x;
      DTensor z = y.redistribute(Layout::parse("S(1)"));
      DTensor w = z * 2.0;
      kept.push_back(w);
      kept_bytes.push_back(shard);
      track(shard - 7 * shard);
      if (static_cast<int>(kept.size()) > kKept) {
        kept.erase(kept.begin());
        track(-kept_bytes.front());
        kept_bytes.erase(kept_bytes.begin());
      }
      comm.barrier();
      if (comm.rank() == 0 && step >= kSteps / 4) {
        const double growth = rss_mib() - start;
        const double allowed = 2.0 * static_cast<double>(peak_live.load()) / (1 << 20) + 96;
        if (growth > worst_growth) worst_growth = growth;
        if (growth > allowed)
          log.add(fmt::format("seed {} step {}: RSS grew by {:.0f} MiB, over 2x the {:.0f} MiB live at most + 96 MiB",
                              kSeed, step, growth, static_cast<double>(peak_live.load()) / (1 << 20)));
      }
      comm.barrier();
    }
  });
  BOOST_TEST_MESSAGE("peak live " << (peak_live.load() >> 20) << " MiB, worst RSS growth " << worst_growth.load()
                                  << " MiB");
  dtensor::testing::check_no_failures(log.failures);
}

BOOST_AUTO_TEST_SUITE_END()
