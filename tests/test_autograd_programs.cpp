// Gradients of whole programs: the forward suite's seeded random op chains
// (random_programs.h, the same seeds) followed by backward agree with the
// unsharded chain's gradients for every leaf, on meshes 4, 2x2 and 2x3; and
// the sequence-parallel Megatron MLP's collectives, split by forward and
// backward.
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <mutex>
#include <set>

#include "random_programs.h"
#include "support.h"

using namespace dtensor;
using namespace random_programs;

namespace autograd_programs {

/// The ops of the chain that have no backward rule (the chain is skipped:
/// a gradient would have to pass through them).
std::set<std::string> ops_without_rule(const Program& p) {
  std::set<std::string> missing;
  for (const Step& s : p.steps)
    if (s.op != "redistribute" && !backward_rule(OpRegistry::global().get(s.op))) missing.insert(s.op);
  return missing;
}

// The loss's weights: fixed random, so every output element matters.
Tensor loss_weight(const Program& p) { return testing::uniform({p.n, p.n}, DType::Float64, p.seed ^ 0x5eedull); }

/// Every leaf's gradient of sum(chain(x0) * w) on full tensors: x0 first,
/// then the operands in order (zeros where no gradient reached a leaf).
std::vector<Tensor> unsharded_grads(const Program& p, const Tensor& x0) {
  std::vector<Tensor> leaves{x0.detach().requires_grad_()};
  for (const Tensor& b : p.operands) leaves.push_back(b.detach().requires_grad_());
  Tensor x = leaves[0];
  for (const Step& s : p.steps) {
    if (s.op == "redistribute") continue;
    x = s.operand >= 0 ? call_op(s.op, {x, leaves[1 + s.operand]}, s.attrs) : call_op(s.op, {x}, s.attrs);
  }
  sum(mul(x, loss_weight(p))).backward();
  std::vector<Tensor> grads;
  for (const Tensor& l : leaves) grads.push_back(l.grad() ? *l.grad() : Tensor::zeros(l.shape(), l.dtype()));
  return grads;
}

/// The same on DTensor leaves in the program's layouts (Partial operands
/// included), gathered with full_tensor(); on every rank.
std::vector<Tensor> sharded_grads(const Program& p, const Tensor& x0, DeviceMesh& mesh) {
  std::vector<DTensor> leaves{
      DTensor::from_local(slice_box(x0, local_box(p.mesh, x0.shape(), p.start, mesh.coordinate())), mesh, p.start,
                          x0.shape())};
  for (std::size_t i = 0; i < p.operands.size(); ++i) {
    const Tensor& b = p.operands[i];
    const Layout& bl = p.operand_layouts[i];
    leaves.push_back(
        DTensor::from_local(testing::source_shard(b, p.mesh, bl, mesh.coordinate(), p.seed + 7), mesh, bl, b.shape()));
  }
  for (DTensor& l : leaves) l.requires_grad_();
  DTensor x = leaves[0];
  for (const Step& s : p.steps) {
    if (s.op == "redistribute")
      x = x.redistribute(s.reshard);
    else
      x = s.operand >= 0 ? call_op(s.op, {x, leaves[1 + s.operand]}, s.attrs) : call_op(s.op, {x}, s.attrs);
  }
  sum(mul(x, distribute_tensor(loss_weight(p), mesh, Layout::replicated(mesh.ndim())))).backward();
  std::vector<Tensor> grads;
  for (const DTensor& l : leaves)
    grads.push_back(l.grad() ? l.grad()->full_tensor() : Tensor::zeros(l.shape(), l.dtype()));
  return grads;
}

BOOST_AUTO_TEST_SUITE(autograd_programs)

// Under MPI, the meshes of the job's size (see backend_meshes).
const std::vector<Shape> kProgramMeshes = testing::backend_meshes({{4}, {2, 2}, {2, 3}});

BOOST_DATA_TEST_CASE(random_chains_backward_match_the_unsharded_gradients,
                     boost::unit_test::data::xrange(kProgramMeshes.size()), mesh_index) {
  const Shape mesh_shape = kProgramMeshes[mesh_index];
  const std::size_t programs = testing::scaled_cases(12, 3);
  std::size_t checked = 0;
  std::vector<std::string> skipped;
  for (std::size_t k = 0; k < programs; ++k) {
    // The forward suite's seeds: the same chains.
    const Program p = make_program(0xC0FFEEull + mesh_index * 1000 + k, mesh_shape);
    const std::set<std::string> missing = ops_without_rule(p);
    if (!missing.empty()) {
      skipped.push_back(fmt::format("seed {} (no backward for {})", p.seed, fmt::join(missing, ", ")));
      continue;
    }
    const Tensor x0 = testing::uniform({p.n, p.n}, DType::Float64, p.seed);
    const std::vector<Tensor> want = unsharded_grads(p, x0);
    std::vector<Tensor> got;
    std::string error;
    std::mutex mu;
    try {
      testing::run_ranks(static_cast<int>(numel(mesh_shape)), [&](Communicator& comm) {
        DeviceMesh mesh(comm, mesh_shape);
        std::vector<Tensor> mine = sharded_grads(p, x0, mesh);
        if (testing::reports_results(comm)) {
          std::lock_guard lock(mu);
          got = std::move(mine);
        }
      });
    } catch (const std::exception& e) {
      error = e.what();
    }
    BOOST_TEST_CONTEXT(describe(p)) {
      BOOST_TEST(error.empty(), error);
      if (!error.empty()) continue;
      BOOST_TEST_REQUIRE(got.size() == want.size());
      for (std::size_t i = 0; i < want.size(); ++i)
        BOOST_TEST(allclose(got[i], want[i], 1e-9, 1e-9),
                   (i == 0 ? std::string("x0") : fmt::format("operand {}", i - 1))
                       << " gradient off by " << max_abs_diff(got[i], want[i]));
    }
    ++checked;
  }
  if (!skipped.empty())
    BOOST_TEST_MESSAGE(fmt::format("mesh {}: {} of {} chains skipped: {}", fmt::join(mesh_shape, "x"), skipped.size(),
                                   programs, fmt::join(skipped, "; ")));
  // Skipping is for ops whose rules are still to come, never for all of them.
  BOOST_TEST(checked > 0u, fmt::format("every chain skipped: {}", fmt::join(skipped, "; ")));
}

// ---- Sequence parallelism ----------------------------------------------------------------------

struct SpCounts {
  CommStats forward, backward;
  bool values_ok = true;
  std::string detail;
};

/// The Megatron MLP with sequence parallelism on a tp mesh of 4: x S(0) on
/// the sequence (token) dim, W1 column-parallel S(0), gelu, W2 row-parallel
/// S(1), the output reduce_scattered back to S(0). The counts of forward
/// and backward apart; the gradients against plain tensors.
SpCounts sequence_parallel_mlp(bool x_needs_grad) {
  const Shape mesh_shape = testing::backend_meshes({{4}}).front();
  const std::int64_t tp = mesh_shape[0], tokens = 2 * tp, ffn = 3 * tp, hidden = 8;
  const Tensor x = testing::uniform({tokens, hidden}, DType::Float64, 1),
               w1 = testing::uniform({ffn, hidden}, DType::Float64, 2),
               w2 = testing::uniform({hidden, ffn}, DType::Float64, 3),
               wt = testing::uniform({tokens, hidden}, DType::Float64, 4);
  std::vector<Tensor> ref{x, w1, w2};
  for (auto& t : ref) t = t.detach().requires_grad_();
  sum(mul(linear(gelu(linear(ref[0], ref[1])), ref[2]), wt)).backward();
  SpCounts counts;
  std::mutex mu;
  testing::run_ranks(static_cast<int>(tp), [&](Communicator& comm) {
    DeviceMesh mesh(comm, mesh_shape, {"tp"});
    const Layout s0 = Layout::parse("S(0)");
    DTensor W1 = distribute_tensor(w1, mesh, s0);
    DTensor W2 = distribute_tensor(w2, mesh, Layout::parse("S(1)"));
    DTensor X = distribute_tensor(x, mesh, s0);
    DTensor Wt = distribute_tensor(wt, mesh, s0);
    W1.requires_grad_();
    W2.requires_grad_();
    if (x_needs_grad) X.requires_grad_();
    CommCounter forward_counter(mesh);
    DTensor y = linear(gelu(linear(X, W1)), W2).redistribute(s0);
    DTensor loss = sum(mul(y, Wt));
    const CommStats f = forward_counter.counts();
    CommCounter backward_counter(mesh);
    loss.backward();
    // x's gradient is Partial over tp: reduced to x's own layout, S(0).
    std::optional<DTensor> gx = x_needs_grad ? std::optional<DTensor>(X.grad()->redistribute(s0)) : std::nullopt;
    const CommStats b = backward_counter.counts();
    bool ok = allclose(W1.grad()->full_tensor(), *ref[1].grad(), 1e-9, 1e-9) &&
              allclose(W2.grad()->full_tensor(), *ref[2].grad(), 1e-9, 1e-9);
    if (gx) ok = ok && allclose(gx->full_tensor(), *ref[0].grad(), 1e-9, 1e-9);
    if (testing::reports_results(comm)) {
      std::lock_guard lock(mu);
      counts.forward = f;
      counts.backward = b;
      counts.values_ok = ok;
      counts.detail =
          fmt::format("forward {}; backward {}; W1.grad {}, W2.grad {}{}", f, b, W1.grad()->placements(),
                      W2.grad()->placements(), gx ? fmt::format(", x.grad {}", X.grad()->placements()) : std::string());
    }
  });
  return counts;
}

// Forward: x gathered for the column-parallel linear (1 all_gather), the
// row-parallel linear's Partial output reduce_scattered to S(0) (1
// reduce_scatter). Backward: the output's S(0) gradient gathered back to R,
// the reduce_scatter's backward (1 all_gather); W2's gradient pairs that
// with gelu's S(1) output, and W1's contracts gelu's S(1) gradient with the
// gathered x the linear node saved (the inputs as the kernel received
// them), so neither needs a collective. In all 2 all_gather + 1
// reduce_scatter, Megatron's sequence-parallel count.
void check_counts(const SpCounts& c, std::uint64_t backward_reduce_scatters) {
  BOOST_TEST(c.values_ok, c.detail);
  BOOST_TEST(c.forward.count(CollectiveKind::AllGather) == 1u, c.detail);
  BOOST_TEST(c.forward.count(CollectiveKind::ReduceScatter) == 1u, c.detail);
  BOOST_TEST(c.forward.data_collectives() == 2u, c.detail);
  BOOST_TEST(c.backward.count(CollectiveKind::AllGather) == 1u, c.detail);
  BOOST_TEST(c.backward.count(CollectiveKind::ReduceScatter) == backward_reduce_scatters, c.detail);
  BOOST_TEST(c.backward.data_collectives() == 1u + backward_reduce_scatters, c.detail);
}

BOOST_AUTO_TEST_CASE(sequence_parallel_mlp_without_input_gradient_is_two_all_gathers_and_one_reduce_scatter) {
  check_counts(sequence_parallel_mlp(false), 0);
}

// With x's gradient: gelu's S(1) gradient times W1 (S(0) on ffn) contracts
// the sharded ffn dim, so x's gradient comes out Partial over tp, and
// reducing it to x's own layout S(0) is one reduce_scatter (the backward
// of the forward's all_gather). Nothing else changes.
BOOST_AUTO_TEST_CASE(sequence_parallel_mlp_with_input_gradient_adds_one_reduce_scatter) {
  check_counts(sequence_parallel_mlp(true), 1);
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace autograd_programs
