// Autograd's communication: the layout changes' backward collectives (each
// redistribution's gradient against the table), to_local/from_local, and the
// Megatron and data-parallel counts of a step. The gradients themselves, the
// recomputation and the errors are in test_autograd.cpp (the same suite).
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <mutex>
#include <optional>

#include "support.h"

using namespace dtensor;

namespace autograd_suite {
namespace {

Tensor uniform(const Shape& shape, std::uint64_t seed, double lo = -1, double hi = 1) {
  Tensor t = Tensor::rand(shape, DType::Float64, seed);
  double* p = t.data_as<double>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = lo + (hi - lo) * p[i];
  return t;
}

struct Row {
  const char* from;
  const char* to;
  const char* grad;  // the gradient's layout as it arrives
  CollectiveKind kind;
  std::uint64_t count;
  const char* back;  // the gradient's layout after backward
};

struct MlpCounts {
  std::uint64_t all_reduce = 0, total = 0, backward_total = 0;
  bool values_ok = true;
  std::string detail;
};

// The loss: sum(y * wt) on y brought to Replicate, or (squared) sum(y * y)
// on the row-parallel output as it comes, Partial: mul then reduces one of
// its two operands, and the backward must not inherit the other's Partial.
MlpCounts megatron(bool x_needs_grad, bool squared = false) {
  const Shape mesh_shape = testing::backend_meshes({{4}}).front();
  const std::int64_t tp = mesh_shape[0], tokens = std::max<std::int64_t>(6, 2 * tp),
                     ffn = std::max<std::int64_t>(12, 3 * tp);
  const Tensor x = uniform({tokens, 8}, 1), w1 = uniform({ffn, 8}, 2), w2 = uniform({8, ffn}, 3),
               wt = uniform({tokens, 8}, 4);
  // The reference gradients on plain tensors.
  std::vector<Tensor> ref{x, w1, w2};
  for (auto& t : ref) t = t.detach().requires_grad_();
  const Tensor y_ref = linear(gelu(linear(ref[0], ref[1])), ref[2]);
  sum(mul(y_ref, squared ? y_ref : wt)).backward();
  MlpCounts counts;
  std::mutex mu;
  testing::run_ranks(static_cast<int>(tp), [&](Communicator& comm) {
    DeviceMesh mesh(comm, mesh_shape, {"tp"});
    DTensor W1 = distribute_tensor(w1, mesh, Layout::parse("S(0)"));
    DTensor W2 = distribute_tensor(w2, mesh, Layout::parse("S(1)"));
    DTensor X = distribute_tensor(x, mesh, Layout::parse("R"));
    DTensor Wt = distribute_tensor(wt, mesh, Layout::parse("R"));
    W1.requires_grad_();
    W2.requires_grad_();
    if (x_needs_grad) X.requires_grad_();
    CommCounter counter(mesh);
    DTensor y = linear(gelu(linear(X, W1)), W2);
    const DTensor loss = squared ? sum(mul(y, y)) : sum(mul(y.redistribute(Layout::parse("R")), Wt));
    CommCounter backward_counter(mesh);
    loss.backward();
    // x's gradient is Partial over tp (Megatron's f): reduced to x's layout.
    std::optional<DTensor> gx =
        x_needs_grad ? std::optional<DTensor>(X.grad()->redistribute(X.placements())) : std::nullopt;
    const CommStats c = counter.counts();
    const CommStats b = backward_counter.counts();
    bool ok = allclose(W1.grad()->full_tensor(), *ref[1].grad(), 1e-9, 1e-9) &&
              allclose(W2.grad()->full_tensor(), *ref[2].grad(), 1e-9, 1e-9);
    if (gx) ok = ok && allclose(gx->full_tensor(), *ref[0].grad(), 1e-9, 1e-9);
    if (testing::reports_results(comm)) {
      std::lock_guard lock(mu);
      counts.all_reduce = c.count(CollectiveKind::AllReduce);
      counts.total = c.data_collectives();
      counts.backward_total = b.data_collectives();
      counts.values_ok = ok;
      counts.detail = fmt::format("forward+backward {}; W1.grad {}, W2.grad {}", c, W1.grad()->placements(),
                                  W2.grad()->placements());
    }
  });
  return counts;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(autograd)

// ---- Layout changes -------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(layout_change_backward_follows_the_table) {
  if (!testing::can_run(4)) return;
  const Row rows[] = {
      {"S(0)", "R", "R", CollectiveKind::AllGather, 0, "S(0)"},
      {"S(0)", "R", "P(sum)", CollectiveKind::ReduceScatter, 1, "S(0)"},
      {"R", "S(0)", "S(0)", CollectiveKind::AllGather, 1, "R"},
      {"P(sum)", "R", "R", CollectiveKind::AllReduce, 0, "R"},
      {"P(sum)", "S(0)", "S(0)", CollectiveKind::AllGather, 1, "R"},
      {"S(0)", "S(1)", "S(1)", CollectiveKind::AllToAll, 1, "S(0)"},
  };
  const Tensor full = uniform({6, 5}, 7), g = uniform({6, 5}, 8);
  for (const Row& row : rows) {
    std::vector<std::string> failures;
    std::mutex mu;
    testing::run_ranks(4, [&](Communicator& comm) {
      DeviceMesh mesh(comm, {4});
      DTensor x = distribute_tensor(full, mesh, Layout::parse(row.from));
      x.requires_grad_();
      DTensor y = x.redistribute(Layout::parse(row.to));
      DTensor grad = distribute_tensor(g, mesh, Layout::parse(row.grad));
      CommCounter counter(mesh);
      y.backward(grad);
      const CommStats c = counter.counts();
      std::string why;
      if (c.count(row.kind) != row.count || c.data_collectives() != row.count)
        why += fmt::format(" issued {} (expected {} of {})", c, row.count, row.kind);
      if (x.grad()->placements() != Layout::parse(row.back))
        why += fmt::format(" gradient in {} (expected {})", x.grad()->placements(), row.back);
      if (!allclose(x.grad()->full_tensor(), g, 1e-12, 1e-12)) why += " wrong values";
      if (!why.empty()) {
        std::lock_guard lock(mu);
        failures.push_back(fmt::format("{} -> {} with the gradient {}:{}", row.from, row.to, row.grad, why));
      }
    });
    testing::check_no_failures(failures);
  }
}

BOOST_AUTO_TEST_CASE(to_local_and_from_local_carry_gradients) {
  if (!testing::can_run(4)) return;
  const Tensor full = uniform({6, 5}, 3);
  std::vector<std::string> failures;
  std::mutex mu;
  testing::run_ranks(4, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {4});
    DTensor x = distribute_tensor(full, mesh, Layout::parse("S(0)"));
    x.requires_grad_();
    // Local math on the shard, then back: the gradient flows through both.
    Tensor local = mul(x.to_local(), 3.0);
    DTensor y = DTensor::from_local(local, mesh, Layout::parse("S(0)"), full.shape());
    sum(y).backward();
    Tensor expected = Tensor::full(full.shape(), 3.0, DType::Float64);
    if (!allclose(x.grad()->full_tensor(), expected)) {
      std::lock_guard lock(mu);
      failures.push_back("to_local/from_local: wrong gradient");
    }
    // to_local(grad_layout): a local gradient that is only this rank's part
    // of the sum, declared Partial.
    DTensor r = distribute_tensor(full, mesh, Layout::parse("R"));
    r.requires_grad_();
    Tensor part = r.to_local(Layout::parse("P(sum)"));
    part.backward(Tensor::ones(part.shape(), DType::Float64));
    if (!allclose(r.grad()->full_tensor(), Tensor::full(full.shape(), 4.0, DType::Float64))) {
      std::lock_guard lock(mu);
      failures.push_back(fmt::format("to_local(P): gradient {}", r.grad()->placements()));
    }
  });
  testing::check_no_failures(failures);
}

// ---- Communication counts -------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(megatron_mlp_backward_without_input_gradient_is_one_all_reduce_in_all) {
  const MlpCounts c = megatron(false);
  BOOST_TEST(c.values_ok, c.detail);
  BOOST_TEST(c.all_reduce == 1u, c.detail);
  BOOST_TEST(c.total == 1u, c.detail);
  BOOST_TEST(c.backward_total == 0u, c.detail);
}

// Before the node saved the reduced copy of y for both operands, this step
// ran an all_gather of W2, one of H, and a reduce_scatter in gelu's backward,
// and left W2's gradient Partial for the optimizer to reduce.
BOOST_AUTO_TEST_CASE(megatron_mlp_with_a_squared_partial_output_is_one_all_reduce_in_all) {
  const MlpCounts c = megatron(false, /*squared=*/true);
  BOOST_TEST(c.values_ok, c.detail);
  BOOST_TEST(c.total == 1u, c.detail);
  BOOST_TEST(c.backward_total == 0u, c.detail);
  BOOST_TEST(c.detail.find("W1.grad S(0), W2.grad S(1)") != std::string::npos, c.detail);
}

BOOST_AUTO_TEST_CASE(megatron_mlp_backward_with_input_gradient_is_two_all_reduces_in_all) {
  const MlpCounts c = megatron(true);
  BOOST_TEST(c.values_ok, c.detail);
  BOOST_TEST(c.all_reduce == 2u, c.detail);
  BOOST_TEST(c.total == 2u, c.detail);
}

BOOST_AUTO_TEST_CASE(data_parallel_weight_gradient_is_partial_and_reduced_once) {
  const Shape mesh_shape = testing::backend_meshes({{4}}).front();
  const std::int64_t dp = mesh_shape[0], batch = 2 * dp + 1;  // uneven shards
  const Tensor w = uniform({3, 5}, 11), x1 = uniform({batch, 5}, 12), x2 = uniform({batch, 5}, 13),
               wt = uniform({batch, 3}, 14);
  Tensor ref = w.detach().requires_grad_();
  sum(mul(linear(x1, ref), wt)).backward();
  sum(mul(linear(x2, ref), wt)).backward();
  std::vector<std::string> failures;
  std::mutex mu;
  testing::run_ranks(static_cast<int>(dp), [&](Communicator& comm) {
    DeviceMesh mesh(comm, mesh_shape, {"dp"});
    DTensor W = distribute_tensor(w, mesh, Layout::parse("R"));
    W.requires_grad_();
    DTensor Wt = distribute_tensor(wt, mesh, Layout::parse("S(0)"));
    std::vector<DTensor> xs{distribute_tensor(x1, mesh, Layout::parse("S(0)")),
                            distribute_tensor(x2, mesh, Layout::parse("S(0)"))};
    std::string why;
    CommCounter all(mesh);
    for (const DTensor& X : xs) {
      DTensor loss = sum(mul(linear(X, W), Wt));
      CommCounter backward_counter(mesh);
      loss.backward();
      if (backward_counter.counts().data_collectives() != 0)
        why += fmt::format(" backward issued {}", backward_counter.counts());
      if (W.grad()->placements() != Layout::parse("P(sum)")) why += fmt::format(" W.grad {}", W.grad()->placements());
    }
    DTensor reduced = W.grad()->redistribute(Layout::parse("R"));
    const CommStats c = all.counts();
    // The loss's own sum over dp is Partial too, never reduced: one
    // all_reduce in all, the gradient's.
    if (c.count(CollectiveKind::AllReduce) != 1 || c.data_collectives() != 1) why += fmt::format(" issued {}", c);
    if (!allclose(reduced.full_tensor(), *ref.grad(), 1e-9, 1e-9)) why += " wrong values";
    if (!why.empty()) {
      std::lock_guard lock(mu);
      failures.push_back("data parallel:" + why);
    }
  });
  testing::check_no_failures(failures);
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace autograd_suite
