// Saves and checks checkpoints for tests/test_checkpoint_crash.py, which
// kills a writer mid-save and then checks that the older checkpoint is intact.
//   checkpoint_program save DIR VALUE [--kill-rank R] [--ranks N]
//       every rank saves a 64x8 f32 tensor of VALUE, S(0) over the ranks;
//       rank R is killed (SIGKILL) just before it writes its file, after the
//       others have had 200 ms to write theirs
//   checkpoint_program check DIR VALUE
//       exit 0 if DIR loads (every checksum verified) as a tensor of VALUE
#include <csignal>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include <dtensor/checkpoint/checkpoint.h>
#include <dtensor/dtensor.h>

using namespace dtensor;

int main(int argc, char** argv) {
  const std::string mode = argc > 3 ? argv[1] : "";
  if (mode != "save" && mode != "check") {
    fmt::print(stderr, "usage: checkpoint_program save|check DIR VALUE [--kill-rank R] [--ranks N]\n");
    return 2;
  }
  const std::string dir = argv[2];
  const double value = std::stod(argv[3]);
  if (mode == "check") {
    try {
      const Tensor got = dcp::load_full(dir).at("w");
      if (!equal(got, Tensor::full({64, 8}, value, DType::Float32))) {
        fmt::print(stderr, "checkpoint_program: {} does not hold {}\n", dir, value);
        return 1;
      }
    } catch (const Error& e) {
      fmt::print(stderr, "checkpoint_program: {}\n", e.what());
      return 1;
    }
    fmt::print("ok: {} holds {}\n", dir, value);
    return 0;
  }
  int kill_rank = -1;
  for (int i = 4; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--kill-rank") kill_rank = std::atoi(argv[i + 1]);
  return launch(argc, argv, [&](Communicator& world) {
    const DeviceMesh mesh(world, {world.size()});
    const DTensor w = from_full(Tensor::full({64, 8}, value, DType::Float32), mesh, Layout::parse("S(0)"));
    dcp::SaveOptions options;
    options.before_writing = [kill_rank](int rank) {
      if (rank != kill_rank) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      std::raise(SIGKILL);
    };
    dcp::save(dir, {{"w", w}}, options);
  });
}
