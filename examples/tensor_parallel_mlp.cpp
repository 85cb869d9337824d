// A Megatron MLP, y = gelu(x W1^T) W2^T, in bf16 on a dp x tp mesh: x is
// split by rows over dp, W1 by output features over tp (column-parallel), W2
// by input features over tp (row-parallel). Only the weights are placed by
// hand; propagation finds the rest, and the forward pass costs exactly one
// all_reduce on tp. The result is checked against the unsharded MLP in f32.
// The same program runs on CPU thread ranks, on simulated GPU ranks sharing
// one GPU, or one GPU per MPI process over NCCL:
//   build/examples/tensor_parallel_mlp --ranks 4
//   build/examples/tensor_parallel_mlp --ranks 4 --device cuda
//   mpirun -np 8 build/examples/tensor_parallel_mlp --device cuda
#include <dtensor/dtensor.h>

using namespace dtensor;

namespace {
// Uniform values in [-scale, scale): keeps activations near 1 through both
// layers, where bf16 carries about 3 significant digits.
Tensor weights(Shape shape, std::uint64_t seed, double scale) {
  return mul(add(Tensor::rand(std::move(shape), DType::Float32, seed), -0.5), 2 * scale);
}
}  // namespace

int main(int argc, char** argv) {
  return launch(argc, argv,
                [](Communicator& world) {
                  const std::int64_t tp = world.size() % 2 == 0 ? 2 : 1, dp = world.size() / tp;
                  DeviceMesh mesh(world, {dp, tp}, {"dp", "tp"});
                  const std::int64_t batch = 16 * dp, hidden = 256, ffn = 1024;
                  const bool lead = world.rank() == 0;
                  // Every rank makes the same full tensors (seeded); only rank 0's are sent.
                  const Tensor x_full = weights({batch, hidden}, 1, 1.0);
                  const Tensor w1_full = weights({ffn, hidden}, 2, 1.0 / 16);
                  const Tensor w2_full = weights({hidden, ffn}, 3, 1.0 / 32);
                  auto place = [&](const Tensor& full, const char* layout) {
                    return distribute_tensor(full.to(DType::BFloat16), mesh, Layout::parse(layout));
                  };
                  const DTensor x = place(x_full, "S(0),R"), w1 = place(w1_full, "R,S(0)"),
                                w2 = place(w2_full, "R,S(1)");

                  CommCounter counter(mesh);
                  const DTensor h = gelu(linear(x, w1));               // [batch, ffn]: S(0),S(1), no communication
                  const DTensor y = linear(h, w2);                     // [batch, hidden]: a Partial(sum) over tp...
                  const DTensor out = y.redistribute(x.placements());  // ...reduced once, back to x's layout
                  const CommStats used = counter.counts();

                  const Tensor want = linear(gelu(linear(x_full, w1_full)), w2_full);
                  const Tensor got = out.full_tensor().to(Device::CPU).to(DType::Float32);
                  const double err = max_abs_diff(got, want);
                  if (lead) {
                    fmt::print("mesh {} on {}: x {}, W1 {}, W2 {}, all bf16\n", fmt::join(mesh.shape(), "x"),
                               mesh.device(), x.placements(), w1.placements(), w2.placements());
                    fmt::print("h = gelu(x W1^T) is {}, y = h W2^T is {}, back to {}\n", h.placements(), y.placements(),
                               out.placements());
                    fmt::print("communication: {}\n", used);
                    fmt::print("max |y - y_f32| = {:.4f} (bf16 tolerance 0.05): {}\n", err,
                               err < 0.05 ? "ok" : "TOO FAR");
                  }
                  if (!(err < 0.05)) throw ValueError(fmt::format("the bf16 MLP is {} away from the f32 one", err));
                },
                {.default_ranks = 4});
}
