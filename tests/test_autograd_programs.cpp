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

BOOST_AUTO_TEST_SUITE_END()

}  // namespace autograd_programs
