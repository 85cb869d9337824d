// Dispatch overhead: the time one op on small DTensors spends outside its
// local kernel, on a propagation-cache hit and on a miss, next to the local
// kernel alone, in one run. 4 thread ranks on a 2x2 mesh; each rank runs the
// same loop and time is the calling thread's CPU time (robust when 4 ranks
// share 2 cores); batches of the kernel and of the hit alternate. Then
// autograd's costs: recording on a hit (the same add with an input that
// requires a gradient, and under NoGradGuard, batches alternating), and the
// Megatron MLP's backward against its forward, alternating, on a tp mesh of
// 4. Run: build/bench/dispatch
#include <dtensor/dtensor.h>

#include <algorithm>
#include <array>
#include <utility>
#include <vector>

#include "thread_timing.h"

using namespace dtensor;

namespace {

using bench::thread_seconds;

template <class Fn>
double batch_ns(int reps, Fn&& fn) {
  return bench::seconds_per_call(reps, fn) * 1e9;
}

template <class Fn>
double per_call_ns(int reps, Fn&& fn) {
  // Best of 5 batches: the least disturbed estimate.
  double best = 1e30;
  for (int b = 0; b < 5; ++b) best = std::min(best, batch_ns(reps, fn));
  return best;
}

// Best of 5 batches of each, alternating, so that the kernel and the hit
// that the overhead subtracts see the same machine load.
template <class Kernel, class Hit>
std::pair<double, double> per_call_pair_ns(int reps, Kernel&& kernel, Hit&& hit) {
  std::pair<double, double> best{1e30, 1e30};
  for (int b = 0; b < 5; ++b) {
    best.first = std::min(best.first, batch_ns(reps, kernel));
    best.second = std::min(best.second, batch_ns(reps, hit));
  }
  return best;
}

// Best of 7 batches of each variant, the variants alternating batch by
// batch.
template <class... Fns>
std::array<double, sizeof...(Fns)> per_call_best_ns(int reps, Fns&&... fns) {
  std::array<double, sizeof...(Fns)> best;
  best.fill(1e30);
  for (int b = 0; b < 7; ++b) {
    std::size_t i = 0;
    ((best[i] = std::min(best[i], batch_ns(reps, fns)), ++i), ...);
  }
  return best;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Row {
  std::string name;
  double kernel_ns, hit_ns, miss_ns;
};

// Rank 0's caches after the rows, then after a run through more distinct
// shapes than the propagation cache holds: the bound at work.
struct CacheRow {
  std::string when;
  CacheStats propagation;
  CacheStats plans;
};

void print_caches(const std::vector<CacheRow>& rows) {
  fmt::print("\nrank 0's caches (entries/capacity, approx bytes, hits, misses, evictions)\n");
  for (const auto& r : rows) {
    const auto& p = r.propagation;
    const auto& q = r.plans;
    fmt::print("{:<44} propagation {}/{}, {:.1f} KiB, {} hits, {} misses, {} evicted\n", r.when, p.entries, p.capacity,
               static_cast<double>(p.bytes) / 1024, p.hits, p.misses, p.evictions);
    fmt::print("{:<44} plans       {}/{}, {:.1f} KiB, {} hits, {} misses, {} evicted\n", "", q.entries, q.capacity,
               static_cast<double>(q.bytes) / 1024, q.hits, q.misses, q.evictions);
  }
}

// Recording on a propagation-cache hit: add on 8x8 shards (2x2 mesh), no
// input requiring a gradient, one that does (a node per call), and that
// one under NoGradGuard.
struct RecordingRow {
  double off_ns, on_ns, guarded_ns;
};

RecordingRow measure_recording() {
  RecordingRow row{};
  run_threads(4, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {2, 2});
    Layout s0 = Layout::parse("S(0),R");
    DTensor a = distribute_tensor(comm.rank() == 0 ? Tensor::rand({16, 8}, DType::Float32, 1) : Tensor(), mesh, s0);
    DTensor b = distribute_tensor(comm.rank() == 0 ? Tensor::rand({16, 8}, DType::Float32, 2) : Tensor(), mesh, s0);
    DTensor ag = a.detach();
    ag.requires_grad_();
    const auto [off, on, guarded] = per_call_best_ns(
        20000, [&] { DTensor t = a + b; }, [&] { DTensor t = ag + b; },
        [&] {
          NoGradGuard no_grad;
          DTensor t = ag + b;
        });
    if (comm.rank() == 0) row = {off, on, guarded};
  });
  return row;
}

// The Megatron MLP (x R, W1 S(0), gelu, W2 S(1), output reduced to R) on a
// tp mesh of 4, f32: each step times the forward (recording, x and both
// weights requiring gradients) and then its backward from a fixed output
// gradient, x's Partial gradient reduced to R (Megatron's f); medians of
// the steps, rank 0's thread CPU time and the wall time.
struct MlpRow {
  double forward_cpu, backward_cpu, forward_wall, backward_wall;
};

MlpRow measure_mlp(int steps) {
  MlpRow row{};
  const std::int64_t batch = 64, hidden = 1024, ffn = 4 * hidden;
  run_threads(4, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {4}, {"tp"});
    const Layout r = Layout::parse("R");
    auto full = [&](const Shape& shape, std::uint64_t seed) {
      return comm.rank() == 0 ? Tensor::rand(shape, DType::Float32, seed) : Tensor();
    };
    DTensor x = distribute_tensor(full({batch, hidden}, 1), mesh, r);
    DTensor w1 = distribute_tensor(full({ffn, hidden}, 2), mesh, Layout::parse("S(0)"));
    DTensor w2 = distribute_tensor(full({hidden, ffn}, 3), mesh, Layout::parse("S(1)"));
    DTensor g = distribute_tensor(full({batch, hidden}, 4), mesh, r);
    for (DTensor* t : {&x, &w1, &w2}) t->requires_grad_();
    std::vector<double> fc, bc, fw, bw;
    for (int step = -2; step < steps; ++step) {  // two warm-up steps
      for (DTensor* t : {&x, &w1, &w2}) t->zero_grad();
      comm.barrier();
      const auto w0 = std::chrono::steady_clock::now();
      const double c0 = thread_seconds();
      DTensor y = linear(gelu(linear(x, w1)), w2).redistribute(r);
      const double c1 = thread_seconds();
      const auto w_1 = std::chrono::steady_clock::now();
      comm.barrier();
      const auto w_2 = std::chrono::steady_clock::now();
      const double c2 = thread_seconds();
      y.backward(g);
      DTensor gx = x.grad()->redistribute(r);
      const double c3 = thread_seconds();
      const auto w3 = std::chrono::steady_clock::now();
      if (step < 0) continue;
      fc.push_back(c1 - c0);
      bc.push_back(c3 - c2);
      fw.push_back(std::chrono::duration<double>(w_1 - w0).count());
      bw.push_back(std::chrono::duration<double>(w3 - w_2).count());
    }
    if (comm.rank() == 0) row = {median(fc), median(bc), median(fw), median(bw)};
  });
  return row;
}

void print_autograd(const RecordingRow& rec, const MlpRow& mlp) {
  fmt::print("\nautograd: recording on a hit, add 16x8 as S(0),R (8x8 per rank), batches alternating\n");
  fmt::print("{:<34} {:>10} {:>10} {:>14} {:>10} {:>12}\n", "", "off ns", "on ns", "no_grad ns", "on/off", "extra us");
  fmt::print("{:<34} {:>10.0f} {:>10.0f} {:>14.0f} {:>10.2f} {:>12.3f}\n", "x requires grad vs not", rec.off_ns,
             rec.on_ns, rec.guarded_ns, rec.on_ns / rec.off_ns, (rec.on_ns - rec.off_ns) / 1e3);
  fmt::print("no_grad/off {:.2f}; goal: extra under 0.5 us\n", rec.guarded_ns / rec.off_ns);
  fmt::print(
      "\nautograd: Megatron MLP, tp 4, f32, x 64x1024 R, W1 4096x1024 S(0), gelu, W2 1024x4096 S(1), "
      "output R (medians of the steps)\n");
  fmt::print("{:<34} {:>12} {:>12} {:>10}\n", "", "forward ms", "backward ms", "bwd/fwd");
  fmt::print("{:<34} {:>12.2f} {:>12.2f} {:>10.2f}\n", "rank 0 thread CPU time", mlp.forward_cpu * 1e3,
             mlp.backward_cpu * 1e3, mlp.backward_cpu / mlp.forward_cpu);
  fmt::print("{:<34} {:>12.2f} {:>12.2f} {:>10.2f}\n", "wall time", mlp.forward_wall * 1e3, mlp.backward_wall * 1e3,
             mlp.backward_wall / mlp.forward_wall);
  fmt::print("goal: backward at most 2.5x the forward (it does twice the flops)\n");
}

}  // namespace

int main() {
  std::vector<Row> rows(3);
  std::vector<CacheRow> caches;
  run_threads(4, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {2, 2});
    auto run = [&](const char* label, const char* op_name, std::vector<DTensor> args, int reps, Row& row) {
      const OpDef& op = OpRegistry::global().get(op_name);
      // The local kernel alone, on the same local shards.
      std::vector<Tensor> locals;
      std::vector<TensorMeta> metas;
      std::vector<Box> boxes;
      std::vector<Layout> layouts;
      for (auto& a : args) {
        locals.push_back(a.to_local());
        metas.push_back({a.shape(), a.dtype()});
        boxes.push_back(a.local_box());
        layouts.push_back(a.placements());
      }
      DTensor probe = call_op(op_name, std::span<const DTensor>(args));
      OpAttrs attrs;
      const TensorMeta out_meta{probe.shape(), probe.dtype()};
      const Box out_box = probe.local_box();
      KernelArgs kargs{locals, metas, boxes, layouts, attrs, out_meta, out_box, probe.placements()};
      const auto [kernel, hit] = per_call_pair_ns(
          reps, [&] { Tensor t = op.cpu_kernel(kargs); },
          [&] { DTensor t = call_op(op_name, std::span<const DTensor>(args)); });
      if (comm.rank() == 0)
        caches.push_back({fmt::format("after the hits of {}", op_name), propagation_cache_stats(), plan_cache_stats()});
      double miss = per_call_ns(reps / 50 + 1, [&] {
        clear_propagation_cache();
        clear_plan_cache();
        DTensor t = call_op(op_name, std::span<const DTensor>(args));
      });
      if (comm.rank() == 0) row = Row{label, kernel, hit, miss};
    };
    Layout s0 = Layout::parse("S(0),R");
    DTensor a = distribute_tensor(comm.rank() == 0 ? Tensor::rand({16, 8}, DType::Float32, 1) : Tensor(), mesh, s0);
    DTensor b = distribute_tensor(comm.rank() == 0 ? Tensor::rand({16, 8}, DType::Float32, 2) : Tensor(), mesh, s0);
    run("add 16x8 as S(0),R (8x8 per rank)", "add", {a, b}, 20000, rows[0]);
    DTensor x = distribute_tensor(comm.rank() == 0 ? Tensor::rand({128, 64}, DType::Float32, 3) : Tensor(), mesh, s0);
    DTensor w = distribute_tensor(comm.rank() == 0 ? Tensor::rand({64, 64}, DType::Float32, 4) : Tensor(), mesh,
                                  Layout::parse("R,R"));
    run("matmul 128x64 @ 64x64 as S(0),R x R,R (64x64 per rank)", "matmul", {x, w}, 2000, rows[1]);
    // The same op on 8x8 shards: the GEMM's own jitter (about 5% of 5.5 us
    // above) no longer hides the dispatch cost of the einsum family.
    DTensor xs = distribute_tensor(comm.rank() == 0 ? Tensor::rand({16, 8}, DType::Float32, 5) : Tensor(), mesh, s0);
    DTensor ws = distribute_tensor(comm.rank() == 0 ? Tensor::rand({8, 8}, DType::Float32, 6) : Tensor(), mesh,
                                   Layout::parse("R,R"));
    run("matmul 16x8 @ 8x8 as S(0),R x R,R (8x8 per rank)", "matmul", {xs, ws}, 20000, rows[2]);
    // A new shape each step: one propagation entry (the add) and one plan
    // (to R) per shape.
    const std::int64_t shapes = static_cast<std::int64_t>(propagation_cache_stats().capacity) + 500;
    for (std::int64_t n = 1; n <= shapes; ++n) {
      DTensor v = distribute_tensor(comm.rank() == 0 ? Tensor::ones({4 * n}) : Tensor(), mesh, s0);
      DTensor t = (v + v).redistribute(Layout::parse("R,R"));
    }
    if (comm.rank() == 0)
      caches.push_back(
          {fmt::format("after {} more distinct shapes", shapes), propagation_cache_stats(), plan_cache_stats()});
  });
  fmt::print("dispatch overhead on a 2x2 mesh (thread CPU time per call, best of 5 batches)\n");
  fmt::print("{:<58} {:>10} {:>10} {:>12} {:>10} {:>12}\n", "op", "kernel ns", "hit ns", "overhead ns", "hit/kern",
             "miss us");
  for (auto& r : rows)
    fmt::print("{:<58} {:>10.0f} {:>10.0f} {:>12.0f} {:>10.2f} {:>12.1f}\n", r.name, r.kernel_ns, r.hit_ns,
               r.hit_ns - r.kernel_ns, r.hit_ns / r.kernel_ns, r.miss_ns / 1e3 - r.kernel_ns / 1e3);
  fmt::print(
      "goal: overhead under 0.5 us on a hit and under 50 us on a miss (PyTorch DTensor: ~9-12 us hit, ~1 ms miss)\n");
  print_caches(caches);
  print_autograd(measure_recording(), measure_mlp(10));
}
