// The README's first program: distribute a tensor on a 2x4 mesh, ask for
// another layout, print the result and the plan the library chose. Runs on 8
// thread ranks, or as an MPI job: mpirun -np 8 build/examples/first_program
#include <dtensor/dtensor.h>

using namespace dtensor;

int main(int argc, char** argv) {
  return launch(argc, argv,
                [](Communicator& world) {  // one call per rank
                  DeviceMesh mesh(world, {2, 4}, {"dp", "tp"});
                  Tensor full = world.rank() == 0 ? Tensor::rand({64, 128}, DType::Float32, /*seed=*/1) : Tensor();
                  DTensor x =
                      distribute_tensor(full, mesh, Layout::parse("S(0),S(1)"));  // rows over dp, columns over tp
                  DTensor y = x.redistribute(Layout::parse("R,S(0)"));            // the planner picks the steps
                  if (world.rank() == 0) fmt::print("{}\n{}\n", y, x.plan_to(Layout::parse("R,S(0)")));
                },
                {.default_ranks = 8});
}
