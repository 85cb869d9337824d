#pragma once
// The embedded default backend: every rank is a thread of this process and
// collectives run over shared memory, each rank copying straight from its
// peers' buffers. Waits block (no spinning) and carry a deadline.
#include <chrono>
#include <functional>

#include "dtensor/mesh/communicator.h"

namespace dtensor {

struct ThreadsOptions {
  /// Longest any rank waits for its peers before CommTimeout. A collective
  /// that times out leaves its group unusable: every rank waiting in it, and
  /// every later collective on that group, throws CommTimeout at once.
  std::chrono::milliseconds timeout{60'000};
};

/// Runs fn(world) on `world_size` ranks, each a thread, and joins them all.
/// If a rank throws, every other rank's pending or next collective fails with
/// PeerFailed, all threads are joined, and run_threads rethrows on the caller
/// as RankFailed naming the first rank that failed and its message.
/// ValueError if world_size < 1.
void run_threads(int world_size, const std::function<void(Communicator& world)>& fn, ThreadsOptions options = {});

}  // namespace dtensor
