#pragma once
// The embedded default backend: every rank is a thread of this process and
// collectives run over shared memory, each rank copying straight from its
// peers' buffers. Waits block (no spinning) and carry a deadline.
#include <chrono>
#include <functional>

#include "dtensor/core/dtype.h"
#include "dtensor/mesh/communicator.h"

namespace dtensor {

/// The most ranks run_threads starts: one thread each, and a thread's stack
/// and the group's slot table grow with it. launch() refuses more too.
inline constexpr int kMaxThreadRanks = 4096;

struct ThreadsOptions {
  /// Longest any rank waits for its peers before CommTimeout, from
  /// kMinTimeout to kMaxTimeout (1 ms to 30 days; else ValueError). A
  /// collective that times out leaves its group unusable: every rank waiting
  /// in it, and every later collective on that group, throws CommTimeout at
  /// once.
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
/// After a failure every other rank has one more `timeout` to return (at
/// most 1 s when a collective already timed out waiting for it); a rank
/// still running then (sleeping or looping in user code, so it never reaches
/// the collective that would stop it) cannot be joined: its thread is
/// detached and run_threads throws RankStalled naming it and what it was last
/// doing (the collective it was in, or the one after which it ran user code).
/// The detached thread may go on using what fn refers to, so the process
/// must then end (launch() does). While no rank has failed, run_threads waits
/// for every rank however long it computes: only collectives have deadlines.
/// ValueError if world_size is not in [1, kMaxThreadRanks] or the timeout is
/// out of range; CommError naming how many ranks started if the system
/// cannot start a thread (the started ones are stopped and joined first).
void run_threads(int world_size, const std::function<void(Communicator& world)>& fn, ThreadsOptions options = {});

}  // namespace dtensor
