// The per-op harness (see op_cases.h): every registered op, every sample,
// every combination of input placements on meshes 4, 2x2 and 2x3, plus a
// sample of Partial(avg|max|min) inputs, checked against the op on the full
// tensors.
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <algorithm>

#include "dtensor/core/hash.h"
#include "op_cases.h"
#include "support.h"

using namespace dtensor;

namespace op_harness {

constexpr std::size_t kMaxCombos = 160;
// Under MPI, the meshes of the job's size (see backend_meshes).
const std::vector<Shape> kMeshes = testing::backend_meshes({{4}, {2, 2}, {2, 3}});

// Combos with Partial(avg), (max) or (min) inputs: for each varied input
// and each of those ops, one combo (drawn from `combos`) whose layout of that
// input has P(sum) changed to the op. Sampled rather than crossed with
// everything, to keep the suite's time: the P(sum) sweep already covers the
// layouts, these cover the reductions.
std::vector<std::vector<Layout>> other_partial_combos(const std::vector<std::vector<Layout>>& combos,
                                                      const std::vector<bool>& varied, std::mt19937_64& rng) {
  std::vector<std::vector<Layout>> out;
  for (std::size_t i = 0; i < varied.size(); ++i) {
    if (!varied[i]) continue;
    std::vector<std::size_t> with_sum;
    for (std::size_t c = 0; c < combos.size(); ++c)
      if (combos[c][i].has_partial()) with_sum.push_back(c);
    if (with_sum.empty()) continue;
    for (ReduceOp op : {ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
      std::vector<Layout> combo = combos[with_sum[rng() % with_sum.size()]];
      std::vector<Placement> ps = combo[i].placements();
      for (Placement& p : ps)
        if (is_partial(p)) p = Partial{op};
      combo[i] = Layout(ps);
      out.push_back(std::move(combo));
    }
  }
  return out;
}

std::vector<std::string> registered_ops() { return OpRegistry::global().names(); }

}  // namespace op_harness
using namespace op_harness;

BOOST_AUTO_TEST_SUITE(ops)

BOOST_AUTO_TEST_CASE(every_registered_op_has_generated_cases) {
  for (const std::string& name : OpRegistry::global().names())
    BOOST_TEST(testing::op_samples().count(name) == 1u, "op '" << name << "' has no generated cases in tests/");
}

BOOST_DATA_TEST_CASE(matches_the_unsharded_op, boost::unit_test::data::make(registered_ops()), op) {
  auto found = testing::op_samples().find(op);
  if (found == testing::op_samples().end()) return;  // reported by the test above
  // FNV-1a of the name, not std::hash: the same seed on every standard library.
  const std::uint64_t seed = testing::seeded(fnv1a(op) % 100000);
  std::mt19937_64 rng(seed);
  std::vector<testing::OpSample> samples = found->second(rng);
  BOOST_TEST(!samples.empty(), "op '" << op << "' generated no samples");
  std::size_t runs = 0;
  for (const Shape& mesh_shape : kMeshes) {
    for (std::size_t si = 0; si < samples.size(); ++si) {
      const testing::OpSample& s = samples[si];
      const Tensor expected = call_op(op, std::span<const Tensor>(s.inputs), s.attrs);
      // Every combination of input layouts (sampled, seeded, past kMaxCombos).
      std::vector<std::vector<Layout>> combos = testing::input_layout_combos(mesh_shape, s);
      std::vector<bool> varied;
      for (std::size_t i = 0; i < s.inputs.size(); ++i)
        varied.push_back(
            std::any_of(combos.begin(), combos.end(), [&](const auto& c) { return c[i] != combos[0][i]; }));
      std::vector<std::vector<Layout>> other_partials = other_partial_combos(combos, varied, rng);
      const std::size_t max_combos = testing::scaled_cases(std::min(combos.size(), kMaxCombos), 4);
      if (combos.size() > max_combos) {
        std::shuffle(combos.begin(), combos.end(), rng);
        combos.resize(max_combos);
      }
      combos.insert(combos.end(), other_partials.begin(), other_partials.end());
      std::string current;
      std::vector<std::string> failures;
      try {
        testing::run_ranks(static_cast<int>(numel(mesh_shape)), [&](Communicator& comm) {
          DeviceMesh mesh(comm, mesh_shape);
          for (const auto& combo : combos) {
            if (testing::reports_results(comm))
              current = fmt::format("op {} seed {} sample {} mesh {} inputs {}", op, seed, si,
                                    fmt::join(mesh_shape, "x"), fmt::join(combo, " | "));
            std::vector<DTensor> args;
            for (std::size_t i = 0; i < combo.size(); ++i) {
              Layout l = validate_layout(combo[i], mesh_shape, s.inputs[i].shape());
              args.push_back(
                  DTensor::from_local(testing::source_shard(s.inputs[i], mesh_shape, l, mesh.coordinate(), seed + i),
                                      mesh, l, s.inputs[i].shape()));
            }
            DTensor y = call_op(op, std::span<const DTensor>(args), s.attrs);
            Tensor got = y.full_tensor();
            if (testing::reports_results(comm) && !allclose(got, expected, s.rtol, s.atol))
              failures.push_back(
                  fmt::format("{}: result {} differs from the unsharded op (max |diff| {}), output layout {}", current,
                              fmt::join(got.shape(), "x"), max_abs_diff(got, expected), y.placements()));
          }
        });
      } catch (const std::exception& e) {
        failures.push_back(fmt::format("{}: {}", current, e.what()));
      }
      runs += combos.size();
      testing::check_no_failures(failures);
    }
  }
  BOOST_TEST_MESSAGE("op " << op << ": " << runs << " layout combinations checked");
}

BOOST_AUTO_TEST_SUITE_END()
