// Tutorial step 4: a Megatron MLP, y = gelu(x W1^T) W2^T, over a tp mesh of
// 4 ranks. W1 is column-parallel (split by output features), W2 row-parallel
// (split by input features): the hidden activations stay split, and the
// only collective of the forward pass is one all_reduce of y's partial sums.
//   build/examples/tutorial/tutorial_04_megatron_mlp
#include "tutorial.h"

using namespace dtensor;

int main(int argc, char** argv) {
  return launch(argc, argv,
                [](Communicator& world) {
                  DeviceMesh mesh(world, {4}, {"tp"});
                  const std::int64_t batch = 8, hidden = 16, ffn = 64;
                  // Every rank makes the same seeded tensors; distribute_tensor sends rank 0's.
                  const Tensor x_full = Tensor::randn({batch, hidden}, DType::Float64, 1);
                  const Tensor w1_full = mul(Tensor::randn({ffn, hidden}, DType::Float64, 2), 0.25);
                  const Tensor w2_full = mul(Tensor::randn({hidden, ffn}, DType::Float64, 3), 0.125);

                  const DTensor x = distribute_tensor(x_full, mesh, Layout::parse("R"));
                  const DTensor w1 = distribute_tensor(w1_full, mesh, Layout::parse("S(0)"));  // column-parallel
                  const DTensor w2 = distribute_tensor(w2_full, mesh, Layout::parse("S(1)"));  // row-parallel

                  CommCounter counter(mesh);
                  const DTensor h = gelu(linear(x, w1));            // each rank: its ffn/4 hidden features
                  const DTensor y = linear(h, w2);                  // each rank: a partial sum of the output
                  const DTensor out = y.redistribute(Layout::parse("R"));  // the one all_reduce
                  const CommStats used = counter.counts();

                  const Tensor want = linear(gelu(linear(x_full, w1_full)), w2_full);  // on one rank, no mesh
                  const Tensor got = out.to_local();  // R: every rank holds the whole output
                  if (world.rank() == 0) {
                    fmt::print("x {}, W1 {}, W2 {}\n", x.placements(), w1.placements(), w2.placements());
                    fmt::print("h = gelu(x W1^T) is {}, local {}\n", h.placements(), h.to_local().shape());
                    fmt::print("y = h W2^T is {}, then {}\n", y.placements(), out.placements());
                    fmt::print("collectives: all_reduce {}, all_gather {}, reduce_scatter {}, in all {}\n",
                               used.count(CollectiveKind::AllReduce), used.count(CollectiveKind::AllGather),
                               used.count(CollectiveKind::ReduceScatter), used.data_collectives());
                    fmt::print("checksum sharded {:.9f}, unsharded {:.9f}; max difference below 1e-12: {}\n",
                               tutorial::checksum(got), tutorial::checksum(want), max_abs_diff(got, want) < 1e-12);
                  }
                },
                {.default_ranks = 4});
}
