// Tutorial step 3: why a plan was chosen. Asking a DTensor for another
// layout runs the planner, a pure function of metadata: the plan lists its
// steps, each a collective on some mesh dims with the bytes the busiest rank
// receives and the planner's reason. With --pictures DIR, a picture per plan.
//   build/examples/tutorial/tutorial_03_plan [--pictures DIR]
#include "tutorial.h"

#include <dtensor/pictures/svg.h>

using namespace dtensor;

namespace {
struct Change {
  const char* from;
  const char* to;
  const char* picture;  // file name under --pictures
};
}  // namespace

int main(int argc, char** argv) {
  return launch(argc, argv,
                [&](Communicator& world) {
                  const auto pictures = tutorial::pictures_dir(argc, argv);
                  DeviceMesh mesh(world, {2, 2}, {"dp", "tp"});
                  const Tensor full = Tensor::rand({10, 6}, DType::Float32, /*seed=*/1);
                  const Change changes[] = {
                      {"S(0),R", "R,R", "03_gather_rows.svg"},
                      {"S(0),P(sum)", "R,S(1)", "03_partial_to_shard.svg"},
                      {"S(0),S(1)", "S(1),S(0)", "03_swap_splits.svg"},
                  };
                  for (const Change& change : changes) {
                    const DTensor x = distribute_tensor(full, mesh, Layout::parse(change.from));
                    // plan_to only plans: nothing is sent until redistribute() runs the plan.
                    const Plan& plan = x.plan_to(Layout::parse(change.to));
                    if (world.rank() != 0) continue;
                    fmt::print("{} -> {}: {} step(s), {} collective(s), busiest rank receives {} bytes\n", plan.from,
                               plan.to, plan.steps.size(), plan.num_collectives(), plan.max_recv_bytes());
                    for (const PlanStep& step : plan.steps) {
                      std::vector<std::string> dims;
                      for (int d : step.mesh_dims) dims.push_back(mesh.dim_names()[d]);
                      fmt::print("  {} on [{}]: {} -> {}, {} bytes\n    why: {}\n", step.kind, fmt::join(dims, ","),
                                 step.from, step.to, step.max_recv_bytes(), step.reason);
                    }
                    pictures::PictureOptions options;
                    options.mesh_dim_names = mesh.dim_names();
                    tutorial::write_picture(pictures, change.picture, pictures::plan_svg(plan, options));
                  }
                },
                {.default_ranks = 4});
}
