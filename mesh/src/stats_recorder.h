#pragma once
// What a backend's communicator records each call into: its own counters
// (Communicator::own_stats, which DeviceMesh::group_stats reports per group
// of mesh dims) and its process rank's totals, shared by every communicator
// of the rank (Communicator::stats). Only the rank's own thread touches
// either, as before the split: two increments, no lock, no allocation.
// While a trace records on the rank (mesh/include/dtensor/mesh/detail/trace_recorder.h) each call also
// becomes one event, timed from begin() (where the backend calls it) to
// record(); otherwise that costs one thread-local test per call.
#include <array>
#include <cstdint>
#include <map>
#include <utility>

#include "dtensor/mesh/communicator.h"
#include "dtensor/mesh/detail/trace_recorder.h"

namespace dtensor::backend_detail {

class StatsRecorder {
 public:
  explicit StatsRecorder(CommStats& rank_totals) : rank_totals_(&rank_totals) {}

  /// Notes when a call starts, for its trace event.
  void begin() {
    if (trace::current != nullptr) [[unlikely]]
      started_ = trace::Clock::now();
  }
  void record(CollectiveKind kind, std::uint64_t bytes) {
    own_.record(kind, bytes);
    rank_totals_->record(kind, bytes);
    if (trace::current != nullptr) [[unlikely]]
      trace::record_collective(&own_, kind, bytes, std::exchange(started_, trace::Clock::time_point{}));
  }
  /// One end of a point-to-point message: a send (`sending`) from `self` to
  /// `peer`, or a recv by `self` from `peer`, ranks of this communicator.
  /// Every backend matches messages between one pair with one tag in order,
  /// so the n-th send from a to b is the n-th recv by b from a: each end
  /// gets that n, counted here for the communicator's whole life (even while
  /// nothing records), and the trace pairs the two ends by it.
  /// (Sends and recvs count apart, so that a rank's messages to itself pair
  /// too. The counts grow with the routes used: one entry per peer and tag.)
  void record_message(bool sending, int self, int peer, int tag, std::uint64_t bytes) {
    const auto kind = sending ? CollectiveKind::Send : CollectiveKind::Recv;
    own_.record(kind, bytes);
    rank_totals_->record(kind, bytes);
    const std::uint64_t sequence = messages_[route(sending, self, peer, tag)]++;
    if (trace::current != nullptr) [[unlikely]]
      trace::record_message(&own_, trace::MessageEnd{sending, self, peer, tag, sequence}, bytes,
                            std::exchange(started_, trace::Clock::time_point{}));
  }
  /// A message taken off its route and refused (its size did not match the
  /// recv's): gone, so the route's later messages keep their numbers; no
  /// event, and the call's start is forgotten.
  void drop_message(bool sending, int self, int peer, int tag) {
    ++messages_[route(sending, self, peer, tag)];
    started_ = trace::Clock::time_point{};
  }
  const CommStats& own() const { return own_; }
  CommStats& rank_totals() { return *rank_totals_; }

 private:
  CommStats own_;
  CommStats* rank_totals_;
  trace::Clock::time_point started_{};  // set by begin() only while recording
  static std::array<int, 4> route(bool sending, int self, int peer, int tag) {
    return {sending ? 1 : 0, sending ? self : peer, sending ? peer : self, tag};
  }
  std::map<std::array<int, 4>, std::uint64_t> messages_;  // (sending, src, dst, tag): messages so far
};

}  // namespace dtensor::backend_detail
