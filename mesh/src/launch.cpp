#include "dtensor/mesh/launch.h"

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "dtensor/core/error.h"
#include "dtensor/mesh/backends.h"
#include "dtensor/mesh/threads.h"
#include "dtensor/mesh/detail/trace_recorder.h"

namespace dtensor {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

std::optional<long> parse_positive(std::string_view text) {
  long value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 1) return std::nullopt;
  return value;
}

// Removes "FLAG V" or "FLAG=V" from argv; returns V, if any. Throws
// ValueError when the flag has no value.
std::optional<std::string> take_flag(int& argc, char** argv, std::string_view flag, std::string_view expected) {
  std::optional<std::string> value;
  int out = 1;
  const std::string with_eq = std::string(flag) + "=";
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == flag) {
      if (i + 1 >= argc) throw ValueError(fmt::format("{} needs a value: expected {}", flag, expected));
      value = argv[++i];
    } else if (a.starts_with(with_eq)) {
      value = std::string(a.substr(with_eq.size()));
    } else {
      argv[out++] = argv[i];
    }
  }
  argc = out;
  argv[argc] = nullptr;
  return value;
}

std::chrono::milliseconds timeout_of(const LaunchOptions& options) {
  if (const char* t = env("DTENSOR_TIMEOUT_MS")) {
    auto v = parse_positive(t);
    if (!v)
      throw ValueError(fmt::format("DTENSOR_TIMEOUT_MS='{}': expected a whole number of milliseconds from {} to {}", t,
                                   kMinTimeout.count(), kMaxTimeout.count()));
    return checked_timeout("DTENSOR_TIMEOUT_MS", std::chrono::milliseconds(*v));
  }
  return checked_timeout("LaunchOptions::timeout", options.timeout);
}

// The thread ranks: --ranks, else $DTENSOR_RANKS, else options.default_ranks;
// a bad value is reported under the name it came by.
long thread_ranks(const std::optional<std::string>& flag, const LaunchOptions& options) {
  const auto expected = [](std::string_view what, std::string_view value) {
    return ValueError(
        fmt::format("{}{}: expected a whole number of thread ranks from 1 to {}", what, value, kMaxThreadRanks));
  };
  std::optional<long> n;
  if (flag) {
    n = parse_positive(*flag);
    if (!n || *n > kMaxThreadRanks) throw expected("--ranks ", fmt::format("'{}'", *flag));
  } else if (const char* e = env("DTENSOR_RANKS")) {
    n = parse_positive(e);
    if (!n || *n > kMaxThreadRanks) throw expected("DTENSOR_RANKS=", fmt::format("'{}'", e));
  } else {
    n = options.default_ranks;
    if (*n < 1 || *n > kMaxThreadRanks) throw expected("LaunchOptions::default_ranks ", std::to_string(*n));
  }
  return *n;
}

// A thread that run_threads had to detach (RankStalled) may still be running
// the program's function, which refers to main()'s locals and to static
// objects: returning into main, or running static destructors and atexit
// handlers under it (exit()), would race with it or deadlock on a lock it
// holds. So flush what the program printed and end the process here, with
// _Exit, which runs neither.
[[noreturn]] void exit_with_stalled_ranks(const RankStalled& e) {
  fmt::print(stderr, "dtensor: {}\ndtensor: ending the process: a stalled rank thread cannot be joined\n", e.what());
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  std::_Exit(1);
}

// --device / DTENSOR_DEVICE: where the ranks keep their shards.
Device launch_device(const std::optional<std::string>& flag) {
  std::string text = flag ? *flag : (env("DTENSOR_DEVICE") ? env("DTENSOR_DEVICE") : "cpu");
  if (text == "cpu") return Device::CPU;
  if (text == "cuda") return Device::CUDA;
  throw ValueError(fmt::format("{}'{}': expected cpu or cuda", flag ? "--device " : "DTENSOR_DEVICE=", text));
}

int run_mpi(std::optional<std::string> ranks_flag, Device device, const std::function<void(Communicator&)>& fn,
            const LaunchOptions& options) {
  if (!mpi_available()) {
    fmt::print(stderr,
               "dtensor: started under an MPI launcher, but this build has no MPI backend: rebuild with "
               "-Dmpi=enabled (or run without mpirun and pass --ranks N for thread ranks)\n");
    return 2;
  }
  std::unique_ptr<Communicator> world;
  try {
    // On GPUs, NCCL over one GPU per process, bootstrapped over MPI.
    world = device == Device::CUDA ? nccl_world(NcclOptions{timeout_of(options)})
                                   : mpi_world(MpiOptions{timeout_of(options)});
  } catch (const std::exception& e) {
    fmt::print(stderr, "dtensor: cannot start {}: {}\n", device == Device::CUDA ? "NCCL" : "MPI", e.what());
    return 2;
  }
  if (ranks_flag) {
    auto n = parse_positive(*ranks_flag);
    if (!n || *n != world->size()) {
      if (world->rank() == 0)
        fmt::print(stderr, "dtensor: --ranks {} but the MPI job has {} processes: expected them to agree\n",
                   *ranks_flag, world->size());
      return 2;
    }
  }
  try {
    mpi_set_program_running(true);
    fn(*world);
    mpi_set_program_running(false);
    // A rank whose body returns while its peers still wait for it (an early
    // return) must not finalise MPI under them: it tells them it is done and
    // waits until they are too, and a peer waiting for it fails at once.
    mpi_finish(world->timeout());
  } catch (const std::exception& e) {
    fmt::print(stderr, "dtensor: rank {} of {} failed: {}\ndtensor: aborting the MPI job\n", world->rank(),
               world->size(), e.what());
    std::fflush(stderr);
    std::fflush(stdout);
    mpi_abort(1);
  }
  std::fflush(stdout);
  return 0;
}

// DTENSOR_TRACE=FILE: fn's whole run on every rank, recorded as one timeline
// in FILE (written by rank 0 once every rank's fn has returned). A rank that
// throws stops recording and writes nothing: its peers fail too.
std::function<void(Communicator&)> traced(const std::function<void(Communicator&)>& fn) {
  const char* path = env("DTENSOR_TRACE");
  if (!path) return fn;
  return [&fn, file = std::string(path)](Communicator& world) {
    trace::Recorder recorder(world);
    recorder.name_group(&world.own_stats(), "world");
    fn(world);
    recorder.finish(file);
  };
}

}  // namespace

bool launched_under_mpi() {
  // Open MPI (mpirun/orterun and PMIx), MPICH's Hydra (PMI) and Slurm's PMI.
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK", "MPI_LOCALNRANKS"})
    if (env(name)) return true;
  return false;
}

std::string_view launch_backend() {
  if (const char* b = env("DTENSOR_BACKEND")) {
    if (std::strcmp(b, "mpi") == 0) return "mpi";
    if (std::strcmp(b, "threads") == 0) return "threads";
  }
  return launched_under_mpi() ? "mpi" : "threads";
}

int launch(int& argc, char** argv, const std::function<void(Communicator& world)>& fn, LaunchOptions options) {
  std::optional<std::string> ranks_flag;
  try {
    ranks_flag = take_flag(argc, argv, "--ranks", "--ranks N with N >= 1");
    const Device device = launch_device(take_flag(argc, argv, "--device", "--device cpu|cuda"));
    if (const char* b = env("DTENSOR_BACKEND"); b && std::strcmp(b, "mpi") != 0 && std::strcmp(b, "threads") != 0)
      throw ValueError(fmt::format("DTENSOR_BACKEND='{}': expected 'threads' or 'mpi'", b));
    std::optional<LinkModel> link;
    if (auto text = take_flag(argc, argv, "--link", "--link LATENCY,BANDWIDTH such as 10us,5GB/s"))
      link = LinkModel::parse(*text);
    const auto traced_fn = traced(fn);
    const std::function<void(Communicator&)> body = [&](Communicator& world) {
      if (link) world.model_link(*link);
      traced_fn(world);
    };
    if (launch_backend() == "mpi") return run_mpi(ranks_flag, device, body, options);

    const long ranks = thread_ranks(ranks_flag, options);
    ThreadsOptions threads_options{timeout_of(options)};
    threads_options.device = device;  // CUDA: simulated GPU ranks on one device
    run_threads(static_cast<int>(ranks), body, threads_options);
    return 0;
  } catch (const RankStalled& e) {
    exit_with_stalled_ranks(e);
  } catch (const RankFailed& e) {
    fmt::print(stderr, "dtensor: {}\n", e.what());  // names the rank
    return 1;
  } catch (const CommError& e) {  // the system could not start every rank thread
    fmt::print(stderr, "dtensor: {}\n", e.what());
    return 1;
  } catch (const ValueError& e) {
    fmt::print(stderr, "dtensor: {}\n", e.what());
    return 2;
  } catch (const UnsupportedError& e) {  // --device cuda in a build without CUDA
    fmt::print(stderr, "dtensor: {}\n", e.what());
    return 2;
  } catch (const DeviceError& e) {  // --device cuda without a usable GPU
    fmt::print(stderr, "dtensor: {}\n", e.what());
    return 2;
  }
}

}  // namespace dtensor
