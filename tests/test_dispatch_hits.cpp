// What a propagation-cache hit costs, without timing it: the heap
// allocations a hit makes beyond its kernel's, counted by replacing the
// global operator new in this binary, and that a hit runs no propagation
// (no cache miss, no planner call). 4 thread ranks on a 2x2 mesh call
// concurrently, as in bench/dispatch.
//
// The design's budget beyond the kernel: none. The kernel takes its inputs
// as one span of Tensors, and a Tensor copy holds its shape inline (Shape
// is an InlineVector); the output DTensor's layout and global shape are
// the cache entry's, shared; small attributes (ScalarAttrs) live inside
// their OpAttrs. A recorded hit adds its node (edges and saved inputs
// inside it) and the output's record: two.
#include <boost/test/unit_test.hpp>

#include <array>
#include <atomic>
#include <cstdlib>
#include <new>
#include <string>

#include "support.h"

namespace {

// Per thread, so that each rank counts its own allocations only.
thread_local std::int64_t allocations = 0;

void* counted_alloc(std::size_t n, std::size_t align) {
  ++allocations;
  if (n == 0) n = 1;
  void* p =
      align <= alignof(std::max_align_t) ? std::malloc(n) : std::aligned_alloc(align, (n + align - 1) / align * align);
  if (!p) throw std::bad_alloc();
  return p;
}

}  // namespace

void* operator new(std::size_t n) { return counted_alloc(n, alignof(std::max_align_t)); }
void* operator new[](std::size_t n) { return counted_alloc(n, alignof(std::max_align_t)); }
void* operator new(std::size_t n, std::align_val_t a) { return counted_alloc(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return counted_alloc(n, static_cast<std::size_t>(a)); }
// The nothrow forms too (std::stable_sort's temporary buffer uses them):
// by default they call the forms above, but a sanitizer's runtime replaces
// them with its own, whose blocks our deletes would then free.
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted_alloc(n, alignof(std::max_align_t));
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t& tag) noexcept { return operator new(n, tag); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try {
    return counted_alloc(n, static_cast<std::size_t>(a));
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t& tag) noexcept {
  return operator new(n, a, tag);
}
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

using namespace dtensor;

namespace dispatch_hits_suite {

constexpr int kCalls = 100;

// One op's figures on one rank: allocations per call of the kernel alone and
// of a hit through each entry, and the cache counters over the hits.
struct Figures {
  double kernel = 0;
  double hit_by_name = 0;    // call_op("add", span)
  double hit_front_end = 0;  // add(a, b), matmul(x, w), neg(x)
  std::uint64_t hits = 0, misses = 0, plan_misses = 0, plan_hits = 0;
  bool shared_meta = false;  // two outputs of one entry share their metadata
};

template <class Fn>
double allocations_per_call(Fn&& fn) {
  const std::int64_t before = allocations;
  for (int i = 0; i < kCalls; ++i) fn();
  return static_cast<double>(allocations - before) / kCalls;
}

template <class FrontEnd>
Figures measure(const char* name, std::vector<DTensor> args, const OpAttrs& attrs, FrontEnd&& front_end) {
  const OpDef& op = OpRegistry::global().get(name);
  std::vector<Tensor> locals;
  std::vector<TensorMeta> metas;
  std::vector<Box> boxes;
  std::vector<Layout> layouts;
  for (const DTensor& a : args) {
    locals.push_back(a.to_local());
    metas.push_back({a.shape(), a.dtype()});
    boxes.push_back(a.local_box());
    layouts.push_back(a.placements());
  }
  const std::span<const DTensor> inputs(args);
  const DTensor probe = call_op(name, inputs, attrs);  // the miss
  const TensorMeta out_meta{probe.shape(), probe.dtype()};
  const Box out_box = probe.local_box();
  const KernelArgs kargs{locals, metas, boxes, layouts, attrs, out_meta, out_box, probe.placements()};
  Figures f;
  f.kernel = allocations_per_call([&] { Tensor t = op.cpu_kernel(kargs); });
  const CacheStats c0 = propagation_cache_stats();
  const CacheStats p0 = plan_cache_stats();
  f.hit_by_name = allocations_per_call([&] { DTensor t = call_op(name, inputs, attrs); });
  f.hit_front_end = allocations_per_call([&] { DTensor t = front_end(args); });
  const CacheStats c1 = propagation_cache_stats();
  const CacheStats p1 = plan_cache_stats();
  f.hits = c1.hits - c0.hits;
  f.misses = c1.misses - c0.misses;
  f.plan_hits = p1.hits - p0.hits;
  f.plan_misses = p1.misses - p0.misses;
  const DTensor again = call_op(name, inputs, attrs);
  f.shared_meta = &again.placements() == &probe.placements() && &again.shape() == &probe.shape();
  return f;
}

BOOST_AUTO_TEST_CASE(a_hit_allocates_only_what_its_kernel_needs_and_propagates_nothing) {
  const std::uint64_t seed = testing::seeded(20261201);
  constexpr int kRanks = 4;
  std::array<Figures, kRanks> add_f, mm_f, neg_f, scale_f;
  run_threads(kRanks, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {2, 2});
    const Layout s0 = Layout::parse("S(0),R");
    auto dist = [&](Shape shape, const Layout& l, std::uint64_t k) {
      return distribute_tensor(comm.rank() == 0 ? Tensor::rand(shape, DType::Float32, seed + k) : Tensor(), mesh, l);
    };
    DTensor a = dist({16, 8}, s0, 1), b = dist({16, 8}, s0, 2);
    DTensor x = dist({32, 16}, s0, 3), w = dist({16, 16}, Layout::parse("R,R"), 4);
    const int r = comm.rank();
    add_f[r] = measure("add", {a, b}, {}, [](const std::vector<DTensor>& v) { return add(v[0], v[1]); });
    mm_f[r] = measure("matmul", {x, w}, {}, [](const std::vector<DTensor>& v) { return matmul(v[0], v[1]); });
    neg_f[r] = measure("neg", {a}, {}, [](const std::vector<DTensor>& v) { return neg(v[0]); });
    // Attributes built on every call (the front end's ScalarAttrs) are held
    // in place: no allocation either.
    scale_f[r] =
        measure("mul_scalar", {a}, ScalarAttrs{.value = 2.0}, [](const std::vector<DTensor>& v) { return v[0] * 2.0; });
  });
  struct Case {
    const char* op;
    const std::array<Figures, kRanks>& figures;
    double budget;  // allocations per hit beyond the kernel's
  };
  for (const Case& c :
       {Case{"add", add_f, 0}, Case{"matmul", mm_f, 0}, Case{"neg", neg_f, 0}, Case{"mul_scalar", scale_f, 0}}) {
    for (int r = 0; r < kRanks; ++r) {
      const Figures& f = c.figures[r];
      BOOST_TEST_CONTEXT("seed " << seed << ", op " << c.op << ", rank " << r << ": kernel " << f.kernel
                                 << " allocations per call, hit by name " << f.hit_by_name << ", front end "
                                 << f.hit_front_end) {
        BOOST_TEST(f.hit_by_name - f.kernel <= c.budget);
        BOOST_TEST(f.hit_front_end - f.kernel <= c.budget);
        BOOST_TEST(f.hits == 2u * kCalls);
        BOOST_TEST(f.misses == 0u);
        BOOST_TEST(f.plan_hits + f.plan_misses == 0u);
        BOOST_TEST(f.shared_meta);
      }
    }
  }
  BOOST_TEST_MESSAGE("allocations per hit beyond the kernel, rank 0: add "
                     << add_f[0].hit_by_name - add_f[0].kernel << ", matmul " << mm_f[0].hit_by_name - mm_f[0].kernel
                     << ", neg " << neg_f[0].hit_by_name - neg_f[0].kernel);
}

BOOST_AUTO_TEST_CASE(a_recorded_hit_allocates_its_node_and_the_outputs_record_only) {
  const std::uint64_t seed = testing::seeded(20261202);
  constexpr int kRanks = 4;
  std::array<double, kRanks> plain{}, recorded{}, released{};
  run_threads(kRanks, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {2, 2});
    const Layout s0 = Layout::parse("S(0),R");
    auto dist = [&](Shape shape, std::uint64_t k) {
      return distribute_tensor(comm.rank() == 0 ? Tensor::rand(shape, DType::Float32, seed + k) : Tensor(), mesh, s0);
    };
    DTensor a = dist({16, 8}, 1), b = dist({16, 8}, 2);
    DTensor x = a.detach();
    x.requires_grad_();
    (void)add(a, b), (void)add(x, b);  // the misses
    const int r = comm.rank();
    plain[r] = allocations_per_call([&] { DTensor t = add(a, b); });
    recorded[r] = allocations_per_call([&] { DTensor t = add(x, b); });
    // In a chain, an input that an op made (an edge to its node) costs no
    // more than a leaf: three recorded adds, three times one.
    released[r] = allocations_per_call([&] { DTensor t = add(add(add(x, b), b), b); });
  });
  for (int r = 0; r < kRanks; ++r) {
    BOOST_TEST_CONTEXT("seed " << seed << ", rank " << r << ": an add allocates " << plain[r]
                               << " per call unrecorded, " << recorded[r] << " recorded") {
      BOOST_TEST(recorded[r] - plain[r] == 2.0);
      BOOST_TEST(released[r] == 3.0 * recorded[r]);
    }
  }
}

}  // namespace dispatch_hits_suite
