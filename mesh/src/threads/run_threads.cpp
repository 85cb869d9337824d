// run_threads: one thread per rank, and how the run ended. A rank that
// throws fails the world (threads_group.cpp), which stops the others at
// their pending or next collective; what is left here is the rank that never
// reaches one (sleeping or looping in user code) and a system that cannot
// start every thread.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtensor/core/cuda.h"
#include "dtensor/core/error.h"
#include "dtensor/mesh/threads.h"
#include "threads_group.h"

namespace dtensor {
namespace {

using namespace threads_detail;
using RankFn = std::function<void(Communicator& world)>;

// Which ranks have returned. The rank threads share it, and everything else
// they touch, by shared_ptr: a thread that run_threads has to detach (see
// wait_for_ranks) must never refer to run_threads' frame.
struct Finish {
  explicit Finish(int n) : done(static_cast<std::size_t>(n), true) {}
  std::mutex mu;
  std::condition_variable cv;
  std::vector<bool> done;  // true for ranks that returned or never started
  int running = 0;
};

void rank_main(const std::shared_ptr<World>& world, const std::shared_ptr<Group>& group,
               const std::shared_ptr<Finish>& finish, const std::shared_ptr<const RankFn>& fn, int r) {
  try {
    if (world->options.device == Device::CUDA) cuda::set_device(world->options.cuda_device);
    auto comm = make_communicator(world, group, r);
    (*fn)(*comm);
  } catch (const std::exception& e) {
    world->fail(r, e.what());
  } catch (...) {
    world->fail(r, "an exception not derived from std::exception");
  }
  {
    std::lock_guard lock(finish->mu);
    finish->done[static_cast<std::size_t>(r)] = true;
    --finish->running;
  }
  finish->cv.notify_all();
}

// How long a rank that a collective already timed out waiting for gets to
// return once the world has failed: it has been away from the collectives
// for a whole deadline, and if it only was about to arrive, it meets the
// failure at once and needs no more than this to unwind.
constexpr std::chrono::milliseconds kLateRankGrace{1000};

// Waits for every started rank. While no rank has failed that may take as
// long as the ranks compute. Once one has, the others stop at their next
// collective, or at once if they wait in one, and a rank in user code gets
// as long to reach one as any collective waits for its peers: one timeout,
// or only min(timeout, kLateRankGrace) when a collective timed out waiting
// for it. Returns the ranks still running then, and how long they had.
struct Stalled {
  std::vector<int> ranks;
  std::chrono::milliseconds waited{0};
};

Stalled wait_for_ranks(World& world, Finish& finish) {
  std::unique_lock lock(finish.mu);
  // Every World::fail comes from a rank that then returns (and notifies), or
  // from run_threads itself before it waits, so this wakes on a failure.
  finish.cv.wait(lock, [&] { return finish.running == 0 || world.has_failed(); });
  const auto failed_at = Clock::now();
  const auto all_done = [&] { return finish.running == 0; };
  const auto running = [&] {
    std::vector<int> ranks;
    for (std::size_t r = 0; r < finish.done.size(); ++r)
      if (!finish.done[r]) ranks.push_back(static_cast<int>(r));
    return ranks;
  };
  const auto timeout = world.options.timeout;
  const auto grace = std::min(timeout, kLateRankGrace);
  if (finish.cv.wait_until(lock, failed_at + grace, all_done)) return {};
  std::vector<int> late;
  {
    std::lock_guard world_lock(world.mu);
    late = world.late;
  }
  const auto left = running();
  const bool all_late = std::all_of(left.begin(), left.end(),
                                    [&](int r) { return std::find(late.begin(), late.end(), r) != late.end(); });
  if (all_late) return {left, grace};
  if (finish.cv.wait_until(lock, failed_at + timeout, all_done)) return {};
  return {running(), timeout};
}

std::string stall_report(const World& world, const std::vector<int>& stalled, std::chrono::milliseconds waited) {
  std::vector<std::string> doing;
  for (int r : stalled)
    doing.push_back(fmt::format("rank {} was {}", r, world.activity[static_cast<std::size_t>(r)].text()));
  const std::string cause = world.failed_rank >= 0
                                ? fmt::format("rank {} failed: {}", world.failed_rank, world.failed_msg)
                                : world.failed_msg;
  return fmt::format("[run_threads] rank{} {} of {} stalled: still running {} ms after {}; {}; {} detached",
                     stalled.size() > 1 ? "s" : "", fmt::join(stalled, ", "), world.size, waited.count(), cause,
                     fmt::join(doing, "; "), stalled.size() > 1 ? "their threads were" : "its thread was");
}

}  // namespace

void run_threads(int world_size, const RankFn& fn, ThreadsOptions options) {
  if (world_size < 1 || world_size > kMaxThreadRanks)
    throw ValueError(
        fmt::format("[run_threads] world_size {}; expected 1 to {} thread ranks", world_size, kMaxThreadRanks));
  checked_timeout("[run_threads] ThreadsOptions::timeout", options.timeout);
  if (options.device == Device::CUDA) {
    cuda::require("run_threads with Device::CUDA (simulated GPU ranks)");
    if (options.cuda_device < 0 || options.cuda_device >= cuda::device_count())
      throw ValueError(fmt::format("[run_threads] cuda_device {}: this process sees {} GPU(s)", options.cuda_device,
                                   cuda::device_count()));
  }
  std::vector<int> ranks(static_cast<std::size_t>(world_size));
  for (int r = 0; r < world_size; ++r) ranks[static_cast<std::size_t>(r)] = r;
  auto world = std::make_shared<World>(world_size, options);
  auto group = std::make_shared<Group>(std::move(ranks));
  world->add_group(group);
  auto finish = std::make_shared<Finish>(world_size);
  auto shared_fn = std::make_shared<const RankFn>(fn);

  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(world_size));
  std::string start_error;
  for (int r = 0; r < world_size; ++r) {
    {
      std::lock_guard lock(finish->mu);
      finish->done[static_cast<std::size_t>(r)] = false;
      ++finish->running;
    }
    try {
      threads.emplace_back(rank_main, world, group, finish, shared_fn, r);
    } catch (const std::exception& e) {  // system_error from pthread_create, bad_alloc for its state
      {
        std::lock_guard lock(finish->mu);
        finish->done[static_cast<std::size_t>(r)] = true;
        --finish->running;
      }
      // The started ranks may wait in a collective for ranks that will never
      // come: fail the world so that they stop, then join them as usual.
      start_error = fmt::format("[run_threads] could start only {} of {} rank threads: {}", r, world_size, e.what());
      world->fail(-1, start_error);
      break;
    }
  }

  const auto [stalled, waited] = wait_for_ranks(*world, *finish);
  for (std::size_t r = 0; r < threads.size(); ++r) {
    // A stalled thread cannot be joined without hanging, and a joinable
    // std::thread left to its destructor calls std::terminate: detach it.
    // It keeps its own references to the world, and run_threads' caller is
    // told (RankStalled) that it may still be running fn.
    if (std::find(stalled.begin(), stalled.end(), static_cast<int>(r)) != stalled.end())
      threads[r].detach();
    else
      threads[r].join();
  }
  if (!stalled.empty()) throw RankStalled(stalled, stall_report(*world, stalled, waited));
  if (!start_error.empty()) throw CommError(start_error);
  if (world->has_failed())
    throw RankFailed(world->failed_rank,
                     fmt::format("[run_threads] rank {} failed: {}", world->failed_rank, world->failed_msg));
}

}  // namespace dtensor
