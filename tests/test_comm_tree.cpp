// CommTree: the collectives of a training step split by scope, with the
// backward and the optimizer step as scopes of their own; each node equal
// to a CommCounterByDims taken around the same region.
#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>

#include <dtensor/dtensor.h>
#include <dtensor/nn/optim.h>

#include "support.h"

namespace comm_tree_suite {
using namespace dtensor;

/// "kind@dims" -> count, for comparing a node with a counter.
std::map<std::string, std::uint64_t> keyed(const std::vector<DimsCount>& counts) {
  std::map<std::string, std::uint64_t> out;
  for (const DimsCount& c : counts)
    out[fmt::format("{}@{}", collective_name(c.kind), fmt::join(c.mesh_dims, ","))] += c.count;
  return out;
}

struct Mlp {
  DTensor w1, w2;
  // The gelu after the row-parallel matmul needs its Partial resolved: one
  // collective over tp in every forward.
  DTensor loss(const DTensor& x) const { return sum(gelu(matmul(gelu(matmul(x, w1)), w2))); }
};

Mlp megatron_mlp(const DeviceMesh& mesh) {
  // Column-parallel then row-parallel over tp, replicated over dp.
  Mlp m{distribute_tensor(testing::integer_tensor({8, 16}, DType::Float64, 1), mesh, Layout::parse("R,S(1)")),
        distribute_tensor(testing::integer_tensor({16, 8}, DType::Float64, 2), mesh, Layout::parse("R,S(0)"))};
  m.w1.requires_grad_();
  m.w2.requires_grad_();
  return m;
}

}  // namespace comm_tree_suite
using namespace comm_tree_suite;

BOOST_AUTO_TEST_SUITE(comm_tree)

BOOST_AUTO_TEST_CASE(a_step_splits_into_forward_backward_and_optimizer) {
  testing::FailureLog log;
  std::string text_of_rank0, json_of_rank0;
  run_threads(4, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {2, 2}, {"dp", "tp"});
    Mlp mlp = megatron_mlp(mesh);
    nn::SGD<DTensor> sgd({mlp.w1, mlp.w2});
    const DTensor x = distribute_tensor(testing::integer_tensor({4, 8}, DType::Float64, 3), mesh,
                                        Layout::parse("S(0),R"));
    CommTree tree(mesh, "step");
    std::map<std::string, std::uint64_t> forward_counted, backward_counted, optimizer_counted;
    for (int micro = 0; micro < 2; ++micro) {
      std::optional<DTensor> loss;
      {
        CommCounterByDims counter(mesh);
        CommScope forward("forward");
        {
          CommScope inner("mlp");
          loss = mlp.loss(x);
        }
        for (auto& [k, n] : keyed(counter.counts())) forward_counted[k] += n;
      }
      CommCounterByDims counter(mesh);
      loss->backward();
      for (auto& [k, n] : keyed(counter.counts())) backward_counted[k] += n;
    }
    CommCounterByDims counter(mesh);
    sgd.step();
    optimizer_counted = keyed(counter.counts());

    const CommNode& root = tree.root();
    auto expect = [&](bool ok, const std::string& what) {
      if (!ok) log.add(fmt::format("rank {}: {}\n{}", comm.rank(), what, tree.text()));
    };
    expect(root.children.size() == 3, "the root has forward, backward and optimizer");
    const CommNode* forward = root.child("forward");
    const CommNode* backward = root.child("backward");
    const CommNode* optimizer = root.child("optimizer");
    expect(forward && backward && optimizer, "a phase is missing");
    if (!(forward && backward && optimizer)) return;
    expect(forward->child("mlp") != nullptr, "the scope inside forward is its child");
    expect(keyed(forward->total()) == forward_counted, "forward differs from its counter");
    expect(keyed(backward->total()) == backward_counted, "backward differs from its counter");
    expect(keyed(optimizer->total()) == optimizer_counted, "optimizer differs from its counter");
    std::uint64_t tp_calls = 0;
    for (const DimsCount& c : forward->total()) tp_calls += c.mesh_dims == std::vector<int>{1} ? c.count : 0;
    // The planner picks the collective (a reduce_scatter here, gelu being
    // pointwise); there is one per micro-batch.
    expect(tp_calls >= 2, "forward resolves the tp Partial in each micro-batch");
    // The weights' gradients are Partial over dp until the step reduces them.
    expect(optimizer->total_count(CollectiveKind::AllReduce) >= 1, "the step reduces the gradients over dp");
    expect(root.counts.empty(), "nothing ran outside the scopes");
    if (comm.rank() == 0) {
      text_of_rank0 = tree.text();
      json_of_rank0 = tree.json();
    }
  });
  testing::check_no_failures(log.failures);
  BOOST_TEST(text_of_rank0.find("\n  forward: ") != std::string::npos, text_of_rank0);
  BOOST_TEST(text_of_rank0.find("\n    mlp: [tp] ") != std::string::npos, text_of_rank0);
  const auto j = nlohmann::json::parse(json_of_rank0);
  BOOST_TEST(j["name"] == "step");
  BOOST_TEST(j["children"].size() == 3u);
  BOOST_TEST(j["children"][0]["children"][0]["name"] == "mlp");
  BOOST_TEST(j["children"][0]["children"][0]["counts"][0]["dim_names"][0] == "tp");
  BOOST_TEST(j["children"][2]["name"] == "optimizer");
}

BOOST_AUTO_TEST_CASE(scopes_without_a_tree_do_nothing_and_trees_nest) {
  testing::FailureLog log;
  run_threads(2, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {2});
    {
      CommScope ignored("nobody records");
      double v = 1;
      comm.all_reduce(&v, &v, 1, DType::Float64, ReduceOp::Sum);
    }
    CommTree outer(mesh);
    double v = 1;
    {
      CommTree inner(mesh, "inner");
      CommScope s("work");
      mesh.comm().all_reduce(&v, &v, 1, DType::Float64, ReduceOp::Sum);
      const CommNode* work = inner.root().child("work");
      if (!work || work->total_count(CollectiveKind::AllReduce) != 1)
        log.add(fmt::format("rank {}: the inner tree saw {}", comm.rank(), inner.text()));
    }
    // The outer tree resumes and counts the inner one's all_reduce as its own.
    if (outer.root().total_count(CollectiveKind::AllReduce) != 1 || !outer.root().children.empty())
      log.add(fmt::format("rank {}: the outer tree saw {}", comm.rank(), outer.text()));
  });
  testing::check_no_failures(log.failures);
}

BOOST_AUTO_TEST_CASE(a_scope_named_as_the_open_one_does_not_nest) {
  std::size_t children = 0, grandchildren = 0;
  run_threads(1, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {1});
    CommTree tree(mesh);
    CommScope a("backward");
    CommScope b("backward");
    children = tree.root().children.size();
    grandchildren = children ? tree.root().children[0].children.size() : 0;
  });
  BOOST_TEST(children == 1u);
  BOOST_TEST(grandchildren == 0u);
}

BOOST_AUTO_TEST_SUITE_END()
