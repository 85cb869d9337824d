#pragma once
// The embedded default backend: every rank is a thread of this process and
// collectives run over shared memory, each rank copying straight from its
// peers' buffers. Waits block (no spinning) and carry a deadline.
#include <chrono>
#include <functional>

#include "dtensor/core/dtype.h"
#include "dtensor/mesh/communicator.h"

namespace dtensor {

struct ThreadsOptions {
  /// Longest any rank waits for its peers before CommTimeout. A collective
  /// that times out leaves its group unusable: every rank waiting in it, and
  /// every later collective on that group, throws CommTimeout at once.
  std::chrono::milliseconds timeout{60'000};
  /// Where the buffers handed to the collectives live. Device::CUDA is the
  /// simulated multi-rank mode: every rank thread works on GPU `cuda_device`
  /// with a stream of its own, and the collectives move data with
  /// device-to-device copies and reduction kernels, so a tensor-parallel
  /// program can be run and checked on one GPU. run_threads throws
  /// DeviceError (or UnsupportedError without CUDA) when there is no GPU.
  Device device = Device::CPU;
  int cuda_device = 0;
};

/// Runs fn(world) on `world_size` ranks, each a thread, and joins them all.
/// If a rank throws, every other rank's pending or next collective fails with
/// PeerFailed, all threads are joined, and run_threads rethrows on the caller
/// as RankFailed naming the first rank that failed and its message.
/// ValueError if world_size < 1.
void run_threads(int world_size, const std::function<void(Communicator& world)>& fn, ThreadsOptions options = {});

}  // namespace dtensor
