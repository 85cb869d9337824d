// The Megatron MLP, found by propagation: x replicated, W1 column-sharded
// (Shard(0) of [out, in]) and W2 row-sharded (Shard(1)) on the tp mesh dim.
// With nothing placed by hand after the weights, the forward issues exactly
// one all_reduce; with sequence parallelism (x sharded on the sequence dim,
// the output asked back in that layout) one all_gather and one
// reduce_scatter instead. PyTorch's test counts the same.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <mutex>

#include "op_cases.h"
#include "support.h"

using namespace dtensor;

namespace megatron_suite {

struct Counts {
  std::uint64_t all_reduce = 0, all_gather = 0, reduce_scatter = 0, all_to_all = 0, total = 0;
  bool values_ok = true;
  std::string layout;
};

Tensor reference_mlp(const Tensor& x, const Tensor& w1, const Tensor& w2) {
  Tensor h = call_op("linear", {x, w1});
  h = call_op("gelu", {h});
  return call_op("linear", {h, w2});
}

Counts run_mlp(bool sequence_parallel) {
  // tp = 4 on thread ranks; under MPI, tp = the job's size.
  const Shape mesh_shape = testing::backend_meshes({{4}}).front();
  // Sizes grow with tp (6 tokens and 12 ffn up to tp = 4), so every rank holds
  // some of each sharded dim, as in a real model.
  const std::int64_t tp = mesh_shape[0], tokens = std::max<std::int64_t>(6, 2 * tp),
                     ffn = std::max<std::int64_t>(12, 3 * tp);
  Tensor x = testing::uniform({tokens, 8}, DType::Float64, 1);  // [tokens, hidden]
  Tensor w1 = testing::uniform({ffn, 8}, DType::Float64, 2);    // [ffn, hidden]
  Tensor w2 = testing::uniform({8, ffn}, DType::Float64, 3);    // [hidden, ffn]
  Tensor expected = reference_mlp(x, w1, w2);
  Counts counts;
  std::mutex mu;
  testing::run_ranks(static_cast<int>(mesh_shape[0]), [&](Communicator& comm) {
    DeviceMesh mesh(comm, mesh_shape, {"tp"});
    DTensor W1 = distribute_tensor(comm.rank() == 0 ? w1 : Tensor(), mesh, Layout::parse("S(0)"));  // colwise
    DTensor W2 = distribute_tensor(comm.rank() == 0 ? w2 : Tensor(), mesh, Layout::parse("S(1)"));  // rowwise
    Layout x_layout = Layout::parse(sequence_parallel ? "S(0)" : "R");
    DTensor X = distribute_tensor(comm.rank() == 0 ? x : Tensor(), mesh, x_layout);
    CommCounter counter(mesh);
    DTensor h = call_op("linear", {X, W1});
    h = call_op("gelu", {h});
    DTensor y = call_op("linear", {h, W2});
    // The output is Partial(sum) until someone needs it: back in x's layout.
    DTensor out = y.redistribute(x_layout);
    CommStats c = counter.counts();
    Tensor got = out.full_tensor();
    if (testing::reports_results(comm)) {
      std::lock_guard lock(mu);
      counts.all_reduce = c.count(CollectiveKind::AllReduce);
      counts.all_gather = c.count(CollectiveKind::AllGather);
      counts.reduce_scatter = c.count(CollectiveKind::ReduceScatter);
      counts.all_to_all = c.count(CollectiveKind::AllToAll);
      counts.total = c.data_collectives();
      counts.values_ok = allclose(got, expected, 1e-9, 1e-9);
      counts.layout = fmt::format("{} -> {}", y.placements(), out.placements());
    }
  });
  return counts;
}

}  // namespace megatron_suite

BOOST_AUTO_TEST_SUITE(megatron)

BOOST_AUTO_TEST_CASE(tensor_parallel_mlp_is_one_all_reduce) {
  auto c = megatron_suite::run_mlp(false);
  BOOST_TEST(c.values_ok);
  BOOST_TEST(c.all_reduce == 1u);
  BOOST_TEST(c.total == 1u, "collectives: " << c.total << " (" << c.layout << ")");
}

BOOST_AUTO_TEST_CASE(sequence_parallel_mlp_is_one_all_gather_and_one_reduce_scatter) {
  auto c = megatron_suite::run_mlp(true);
  BOOST_TEST(c.values_ok);
  BOOST_TEST(c.all_gather == 1u);
  BOOST_TEST(c.reduce_scatter == 1u);
  BOOST_TEST(c.total == 2u, "collectives: " << c.total << " (" << c.layout << ")");
}

BOOST_AUTO_TEST_SUITE_END()
