#pragma once
// What a backend's communicator records each call into: its own counters
// (Communicator::own_stats, which DeviceMesh::group_stats reports per group
// of mesh dims) and its process rank's totals, shared by every communicator
// of the rank (Communicator::stats). Only the rank's own thread touches
// either, as before the split: two increments, no lock, no allocation.
// While a timeline records on the rank (mesh/timeline.h) each call also
// becomes one event, timed from begin() (where the backend calls it) to
// record(); otherwise that costs one thread-local test per call.
#include <cstdint>
#include <utility>

#include "dtensor/mesh/communicator.h"
#include "mesh/timeline.h"

namespace dtensor::backend_detail {

class StatsRecorder {
 public:
  explicit StatsRecorder(CommStats& rank_totals) : rank_totals_(&rank_totals) {}

  /// Notes when a call starts, for its timeline event.
  void begin() {
    if (timeline::current != nullptr) [[unlikely]]
      started_ = timeline::Clock::now();
  }
  void record(CollectiveKind kind, std::uint64_t bytes) {
    own_.record(kind, bytes);
    rank_totals_->record(kind, bytes);
    if (timeline::current != nullptr) [[unlikely]]
      timeline::record_collective(&own_, kind, bytes, std::exchange(started_, timeline::Clock::time_point{}));
  }
  const CommStats& own() const { return own_; }
  CommStats& rank_totals() { return *rank_totals_; }

 private:
  CommStats own_;
  CommStats* rank_totals_;
  timeline::Clock::time_point started_{};  // set by begin() only while recording
};

}  // namespace dtensor::backend_detail
