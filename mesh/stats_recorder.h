#pragma once
// What a backend's communicator records each call into: its own counters
// (Communicator::own_stats, which DeviceMesh::group_stats reports per group
// of mesh dims) and its process rank's totals, shared by every communicator
// of the rank (Communicator::stats). Only the rank's own thread touches
// either, as before the split: two increments, no lock, no allocation.
#include <cstdint>

#include "dtensor/mesh/communicator.h"

namespace dtensor::backend_detail {

class StatsRecorder {
 public:
  explicit StatsRecorder(CommStats& rank_totals) : rank_totals_(&rank_totals) {}

  void record(CollectiveKind kind, std::uint64_t bytes) {
    own_.record(kind, bytes);
    rank_totals_->record(kind, bytes);
  }
  const CommStats& own() const { return own_; }
  CommStats& rank_totals() { return *rank_totals_; }

 private:
  CommStats own_;
  CommStats* rank_totals_;
};

}  // namespace dtensor::backend_detail
