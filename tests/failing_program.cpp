// A program whose rank 1 fails mid-run, for tests/test_failures.py: every
// other rank must stop with a clear error within the timeout and the job
// must end with a non-zero exit code, on threads and under MPI alike.
//   failing_program throw|exit|exit_call|return|stall [--ranks N]
//     throw      rank 1 throws while the others wait in a collective
//     exit       rank 1 exits (code 3) without a word to its peers (_Exit)
//     exit_call  rank 1 calls exit(0), which runs the atexit hooks
//     return     rank 1's body returns early, its peers still redistribute
//     stall      rank 1 stops calling collectives; its peers time out
#include <dtensor/dtensor.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

using namespace dtensor;

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "throw" && mode != "exit" && mode != "exit_call" && mode != "return" && mode != "stall") {
    fmt::print(stderr, "usage: failing_program throw|exit|exit_call|return|stall [--ranks N]\n");
    return 2;
  }
  return launch(argc, argv, [&](Communicator& world) {
    DeviceMesh mesh(world, {world.size()});
    DTensor x = ones({8, 8}, mesh, Layout::parse("S(0)"));
    for (int step = 0; step < 3; ++step) {
      if (step == 1 && world.rank() == 1) {
        if (mode == "throw") throw ValueError("rank 1 gives up on purpose at step 1");
        if (mode == "exit") std::_Exit(3);
        if (mode == "exit_call") std::exit(0);
        if (mode == "return") return;
        std::this_thread::sleep_for(std::chrono::minutes(10));  // stall
      }
      x = x.redistribute(Layout::parse("R")).redistribute(Layout::parse("S(0)"));
    }
    if (world.rank() == 0) fmt::print("finished: the failure went unnoticed\n");
  });
}
