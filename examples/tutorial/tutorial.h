#pragma once
// What the tutorial's programs share: reading `--pictures DIR`, writing a
// picture there, and printing from every rank in rank order so that the
// output is the same on every run (docs/tutorial.md holds it verbatim and
// tests/test_tutorial.py compares).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>

#include <dtensor/dtensor.h>

namespace tutorial {

/// The folder after `--pictures`, if given (launch() has already taken
/// --ranks and --device out of argv). ValueError for anything else, so a
/// mistyped flag is not silently ignored.
inline std::optional<std::filesystem::path> pictures_dir(int argc, char** argv) {
  std::optional<std::filesystem::path> dir;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--pictures" && i + 1 < argc) {
      dir = argv[++i];
    } else {
      throw dtensor::ValueError(
          fmt::format("[tutorial] unknown argument '{}': expected --pictures DIR (and --ranks N)", arg));
    }
  }
  return dir;
}

/// Writes `svg` to dir/name when a folder was given; says nothing on stdout,
/// so the output with and without pictures is the same.
inline void write_picture(const std::optional<std::filesystem::path>& dir, std::string_view name,
                          const std::string& svg) {
  if (!dir) return;
  std::filesystem::create_directories(*dir);
  const std::filesystem::path path = *dir / name;
  std::ofstream out(path);
  out << svg;
  if (!out) throw dtensor::Error(fmt::format("[tutorial] could not write {}", path.string()));
}

/// The sum of all elements, on one rank: the fingerprint printed for a result.
inline double checksum(const dtensor::Tensor& t) { return dtensor::sum(t).get({}); }

/// Every rank prints `text` in turn, rank 0 first. Thread ranks share one
/// stdout, so without the turns their lines would interleave differently on
/// each run. The barriers are collectives: keep this out of counted regions.
inline void print_in_rank_order(dtensor::Communicator& world, std::string_view text) {
  for (int turn = 0; turn < world.size(); ++turn) {
    if (turn == world.rank()) {
      fmt::print("{}", text);
      std::fflush(stdout);
    }
    world.barrier();
  }
}

}  // namespace tutorial
