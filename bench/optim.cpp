// An optimizer step on DTensors against the same step on plain tensors of
// the local shapes. The goal is at most 1.5x, so that sharding costs the
// optimizer little beyond its own update loops (PyTorch's DTensor step is
// 9-30x its plain one, pytorch#109477, #134191). 4 thread ranks, 8
// parameters of 512x512 f32 (about 2M parameters), gradients already in the
// parameters' layouts so that no collective runs: the ratio is what the
// DTensor bookkeeping adds to the update loops. Each rank's thread CPU time,
// best of 7 batches, batches alternating.
#include <algorithm>
#include <array>
#include <vector>

#include <dtensor/dtensor.h>
#include <dtensor/nn/optim.h>
#include <fmt/format.h>

#include "thread_timing.h"

using namespace dtensor;

namespace {

template <class Fn>
double batch_us(int reps, Fn&& fn) {
  return bench::seconds_per_call(reps, fn) * 1e6;
}

struct Row {
  const char* layout;
  double sgd_plain, sgd_dtensor, adam_plain, adam_dtensor;
};

Row measure(const char* layout_text) {
  Row row{layout_text, 1e30, 1e30, 1e30, 1e30};
  run_threads(4, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {4});
    const Layout layout = Layout::parse(layout_text);
    std::vector<DTensor> sharded;
    std::vector<Tensor> plain;
    for (int i = 0; i < 8; ++i) {
      const Tensor full = Tensor::randn({512, 512}, DType::Float32, 10 + static_cast<std::uint64_t>(i));
      DTensor p = distribute_tensor(full, mesh, layout);
      p.requires_grad_();
      p.set_grad(distribute_tensor(Tensor::randn({512, 512}, DType::Float32, 100 + static_cast<std::uint64_t>(i)), mesh,
                                   layout));
      Tensor q = p.to_local().clone();
      q.requires_grad_();
      q.set_grad(p.grad()->to_local().clone());
      sharded.push_back(p);
      plain.push_back(q);
    }
    const nn::SGDOptions so{.lr = 1e-3, .momentum = 0.9};
    const nn::AdamWOptions ao{.lr = 1e-4};
    nn::SGD<Tensor> sgd_plain(plain, so);
    nn::SGD<DTensor> sgd_sharded(sharded, so);
    nn::AdamW<Tensor> adam_plain(plain, ao);
    nn::AdamW<DTensor> adam_sharded(sharded, ao);
    std::array<double, 4> best{1e30, 1e30, 1e30, 1e30};
    for (int b = 0; b < 7; ++b) {
      best[0] = std::min(best[0], batch_us(10, [&] { sgd_plain.step(); }));
      best[1] = std::min(best[1], batch_us(10, [&] { sgd_sharded.step(); }));
      best[2] = std::min(best[2], batch_us(10, [&] { adam_plain.step(); }));
      best[3] = std::min(best[3], batch_us(10, [&] { adam_sharded.step(); }));
    }
    if (comm.rank() == 0) row = Row{layout_text, best[0], best[1], best[2], best[3]};
  });
  return row;
}

}  // namespace

int main() {
  fmt::print("optimizer step, 8 parameters of 512x512 f32 on a mesh of 4 (rank 0's thread CPU time, best of 7)\n");
  fmt::print("{:<8} {:>14} {:>14} {:>8} {:>14} {:>14} {:>8}\n", "layout", "SGD plain us", "SGD DTensor us", "ratio",
             "AdamW plain us", "AdamW DTensor", "ratio");
  for (const char* layout : {"S(0)", "R"}) {
    const Row r = measure(layout);
    fmt::print("{:<8} {:>14.1f} {:>14.1f} {:>8.2f} {:>14.1f} {:>14.1f} {:>8.2f}\n", r.layout, r.sgd_plain,
               r.sgd_dtensor, r.sgd_dtensor / r.sgd_plain, r.adam_plain, r.adam_dtensor, r.adam_dtensor / r.adam_plain);
  }
  fmt::print("goal: DTensor / plain at most 1.5 (PyTorch's DTensor optimizer step: 9-30x its plain one)\n");
}
