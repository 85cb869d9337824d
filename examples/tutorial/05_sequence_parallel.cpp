// Tutorial step 5: sequence parallelism. Between blocks the activations
// [sequence, hidden] stay split along the sequence over tp, so that norms,
// dropout and the residual add run on a quarter of the tokens each. The MLP
// block needs whole tokens' worth of the sequence, so it starts with an
// all_gather of the sequence, and where step 4 all_reduced its partial
// output it reduce_scatters it back onto the sequence instead: the same
// bytes as that one all_reduce, split in two collectives.
//   build/examples/tutorial/tutorial_05_sequence_parallel
#include "tutorial.h"

using namespace dtensor;

int main(int argc, char** argv) {
  return launch(argc, argv,
                [](Communicator& world) {
                  DeviceMesh mesh(world, {4}, {"tp"});
                  const std::int64_t sequence = 8, hidden = 16, ffn = 64;
                  const Tensor x_full = Tensor::randn({sequence, hidden}, DType::Float64, 1);
                  const Tensor w1_full = mul(Tensor::randn({ffn, hidden}, DType::Float64, 2), 0.25);
                  const Tensor w2_full = mul(Tensor::randn({hidden, ffn}, DType::Float64, 3), 0.125);

                  const Layout by_sequence = Layout::parse("S(0)");
                  const DTensor x = distribute_tensor(x_full, mesh, by_sequence);  // 2 tokens per rank
                  const DTensor w1 = distribute_tensor(w1_full, mesh, Layout::parse("S(0)"));
                  const DTensor w2 = distribute_tensor(w2_full, mesh, Layout::parse("S(1)"));

                  // Outside the block: a pointwise op on the split sequence costs no communication.
                  CommCounter between(mesh);
                  const DTensor x_scaled = mul(x, 0.5);
                  const std::uint64_t between_count = between.counts().data_collectives();

                  CommCounter block(mesh);
                  const DTensor x_whole = x_scaled.redistribute(Layout::parse("R"));  // all_gather the sequence
                  const DTensor y = linear(gelu(linear(x_whole, w1)), w2);          // P(sum), as in step 4
                  const DTensor out = y.redistribute(by_sequence);                  // reduce_scatter onto it
                  const CommStats used = block.counts();

                  const Tensor want = linear(gelu(linear(mul(x_full, 0.5), w1_full)), w2_full);
                  const Tensor got = out.full_tensor();
                  if (world.rank() == 0) {
                    fmt::print("between blocks: x {}, local {}, {} collectives\n", x_scaled.placements(),
                               x_scaled.to_local().shape(), between_count);
                    fmt::print("block: in {} -> {}, out {} -> {}\n", x_scaled.placements(), x_whole.placements(),
                               y.placements(), out.placements());
                    fmt::print("collectives: all_gather {}, reduce_scatter {}, all_reduce {}, in all {}\n",
                               used.count(CollectiveKind::AllGather), used.count(CollectiveKind::ReduceScatter),
                               used.count(CollectiveKind::AllReduce), used.data_collectives());
                    fmt::print("checksum sharded {:.9f}, unsharded {:.9f}; max difference below 1e-12: {}\n",
                               tutorial::checksum(got), tutorial::checksum(want), max_abs_diff(got, want) < 1e-12);
                  }
                },
                {.default_ranks = 4});
}
