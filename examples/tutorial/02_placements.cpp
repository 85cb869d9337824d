// Tutorial step 2: Shard, Replicate and Partial. One 6x4 tensor in several
// layouts on a 2x2 mesh; for each, the box of the tensor every rank holds.
// With --pictures DIR, one picture per layout.
//   build/examples/tutorial/tutorial_02_placements [--pictures DIR]
#include "tutorial.h"

#include <dtensor/pictures/svg.h>

using namespace dtensor;

namespace {
struct Example {
  const char* layout;
  const char* picture;  // file name under --pictures
  const char* meaning;
};
}  // namespace

int main(int argc, char** argv) {
  return launch(argc, argv,
                [&](Communicator& world) {
                  const auto pictures = tutorial::pictures_dir(argc, argv);
                  DeviceMesh mesh(world, {2, 2}, {"dp", "tp"});
                  const Tensor full = Tensor::arange({6, 4}, DType::Float64);
                  const Example examples[] = {
                      {"S(0),R", "02_s0_r.svg", "rows split over dp, copied over tp"},
                      {"S(0),S(1)", "02_s0_s1.svg", "rows over dp, columns over tp"},
                      {"S(0),S(0)", "02_s0_s0.svg", "rows split 4 ways: dp first, then tp inside"},
                      {"R,R", "02_r_r.svg", "every rank holds everything"},
                      {"S(0),P(sum)", "02_s0_psum.svg", "rows over dp; the tp pair's blocks add up to the value"},
                  };
                  for (const Example& example : examples) {
                    const DTensor x = distribute_tensor(full, mesh, Layout::parse(example.layout));
                    if (world.rank() == 0) {
                      fmt::print("{}: {}\n", example.layout, example.meaning);
                      // local_box is metadata: rank 0 can work out every rank's box without asking it.
                      for (int rank = 0; rank < world.size(); ++rank) {
                        const Shape coord = mesh.coordinate_of(rank);
                        const Box box = local_box(mesh.shape(), x.shape(), x.placements(), coord);
                        fmt::print("  rank {} {}: rows {}..{}, columns {}..{}\n", rank, coord, box.offset[0],
                                   box.offset[0] + box.size[0], box.offset[1], box.offset[1] + box.size[1]);
                      }
                      tutorial::write_picture(pictures, example.picture, pictures::to_svg(x));
                    }
                  }

                  // A Partial value is usually made by an op (a matmul over a split inner dim); here each rank
                  // says its own part: on every tp pair the parts 1 and 2 add up to 3.
                  const Layout partial = Layout::parse("R,P(sum)");
                  const Tensor part = Tensor::full({2, 2}, mesh.coordinate()[1] + 1.0, DType::Float64);
                  const DTensor sum_pending = DTensor::from_local(part, mesh, partial);
                  const Tensor value = sum_pending.full_tensor();  // the pending sum happens here (an all_reduce)
                  if (world.rank() == 0)
                    fmt::print("R,P(sum) from local parts 1 and 2: full_tensor() is 3 everywhere: {}\n",
                               equal(value, Tensor::full({2, 2}, 3.0, DType::Float64)));
                },
                {.default_ranks = 4});
}
