// Tutorial step 7: FSDP (ZeRO-3). Each parameter is stored split S(0) over
// dp, a quarter per rank. recompute_gathered() gathers a unit's parameters
// for use (one all_gather), frees them after the forward, gathers them
// again for the backward (one more), and sends their gradients back to the
// shards as S(0) (one reduce_scatter). The optimizer then updates each
// rank's shard with no collective at all.
//   build/examples/tutorial/tutorial_07_fsdp
#include "tutorial.h"

#include <span>

#include <dtensor/nn/optim.h>

using namespace dtensor;

int main(int argc, char** argv) {
  return launch(argc, argv,
                [](Communicator& world) {
                  DeviceMesh mesh(world, {4}, {"dp"});
                  const Tensor x_full = Tensor::randn({16, 8}, DType::Float64, 1);
                  const Tensor w1_full = mul(Tensor::randn({32, 8}, DType::Float64, 2), 0.25);
                  const Tensor w2_full = mul(Tensor::randn({8, 32}, DType::Float64, 3), 0.125);

                  const DTensor x = distribute_tensor(x_full, mesh, Layout::parse("S(0)"));
                  DTensor w1 = distribute_tensor(w1_full, mesh, Layout::parse("S(0)"));
                  DTensor w2 = distribute_tensor(w2_full, mesh, Layout::parse("S(0)"));
                  w1.requires_grad_();
                  w2.requires_grad_();
                  nn::SGDOptions plain_sgd;
                  plain_sgd.lr = 0.01;
                  nn::SGD<DTensor> optimizer({w1, w2}, plain_sgd);

                  // The unit: an MLP on the whole (gathered) weights.
                  auto mlp = [](std::span<const DTensor> inputs, std::span<const DTensor> weights) {
                    return linear(gelu(linear(inputs[0], weights[0])), weights[1]);
                  };
                  const Layout whole[] = {Layout::parse("R"), Layout::parse("R")};

                  for (int step = 1; step <= 2; ++step) {
                    const DTensor inputs[] = {x}, params[] = {w1, w2};
                    CommCounter forward(mesh);
                    const DTensor out = recompute_gathered(mlp, inputs, params, whole);
                    const DTensor loss = sum(mul(out, out));
                    const CommStats forward_used = forward.counts();
                    CommCounter backward(mesh);
                    loss.backward();
                    const CommStats backward_used = backward.counts();
                    CommCounter update(mesh);
                    optimizer.step();
                    optimizer.zero_grad();
                    const CommStats update_used = update.counts();
                    if (world.rank() == 0) {
                      auto line = [](const char* phase, const CommStats& used) {
                        fmt::print("  {:<9} all_gather {}, reduce_scatter {}, all_reduce {}\n", phase,
                                   used.count(CollectiveKind::AllGather), used.count(CollectiveKind::ReduceScatter),
                                   used.count(CollectiveKind::AllReduce));
                      };
                      fmt::print("step {}: W1 {} local {}, W2 {} local {}\n", step, w1.placements(),
                                 w1.to_local().shape(), w2.placements(), w2.to_local().shape());
                      line("forward", forward_used);
                      line("backward", backward_used);
                      line("optimizer", update_used);
                    }
                  }

                  // The same two steps on one rank, for comparison.
                  Tensor v1 = w1_full.clone(), v2 = w2_full.clone();
                  v1.requires_grad_();
                  v2.requires_grad_();
                  nn::SGD<Tensor> single_rank({v1, v2}, plain_sgd);
                  for (int step = 1; step <= 2; ++step) {
                    const Tensor out = linear(gelu(linear(x_full, v1)), v2);
                    sum(mul(out, out)).backward();
                    single_rank.step();
                    single_rank.zero_grad();
                  }
                  const Tensor w1_got = w1.full_tensor(), w2_got = w2.full_tensor();
                  if (world.rank() == 0)
                    fmt::print("W1 and W2 after two steps equal the single-rank steps (to 1e-12): {}\n",
                               max_abs_diff(w1_got, v1) < 1e-12 && max_abs_diff(w2_got, v2) < 1e-12);
                },
                {.default_ranks = 4});
}
