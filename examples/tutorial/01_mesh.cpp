// Tutorial step 1: a tensor on one rank, then the same tensor on a 2x2 mesh.
// Each of the 4 ranks holds one block; full_tensor() puts them back together.
//   build/examples/tutorial/tutorial_01_mesh
#include "tutorial.h"

using namespace dtensor;

int main(int argc, char** argv) {
  return launch(argc, argv,
                [](Communicator& world) {
                  // Every rank makes the same 8x6 tensor of 0, 1, ..., 47; an ordinary Tensor lives on one rank.
                  const Tensor full = Tensor::arange({8, 6}, DType::Float64);
                  if (world.rank() == 0) fmt::print("a plain tensor: shape {}\n", full.shape());

                  // The 4 ranks as a 2x2 grid: mesh dim 0 is named dp, mesh dim 1 tp.
                  DeviceMesh mesh(world, {2, 2}, {"dp", "tp"});
                  // Rows split over dp, columns over tp: each rank keeps a 4x3 block.
                  const DTensor x = distribute_tensor(full, mesh, Layout::parse("S(0),S(1)"));
                  if (world.rank() == 0) fmt::print("as a DTensor: {}\n", x);

                  tutorial::print_in_rank_order(
                      world, fmt::format("rank {} at mesh coordinate {}: local shape {}, offset {}\n", world.rank(),
                                         mesh.coordinate(), x.to_local().shape(), x.local_box().offset));

                  // A collective: every rank gets the whole tensor back.
                  const Tensor back = x.full_tensor();
                  if (world.rank() == 0) fmt::print("full_tensor() equals the original: {}\n", equal(back, full));
                },
                {.default_ranks = 4});
}
