#pragma once
// What a backend's communicator records each call into: its own counters
// (Communicator::own_stats, which DeviceMesh::group_stats reports per group
// of mesh dims) and its process rank's totals, shared by every communicator
// of the rank (Communicator::stats). Only the rank's own thread touches
// either, as before the split: two increments, no lock, no allocation.
// While a trace records on the rank (mesh/include/dtensor/mesh/detail/trace_recorder.h) each call also
// becomes one event, timed from begin() (where the backend calls it) to
// record(); otherwise that costs one thread-local test per call.
// A started call (dtensor/mesh/work.h) runs on the rank's worker, which
// records into the call's WorkState instead (mesh_detail::deferred_records);
// the rank's thread applies those records when it waits, so that the
// counters and the trace still have one writer.
#include <array>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "dtensor/mesh/communicator.h"
#include "dtensor/mesh/detail/trace_recorder.h"
#include "rank_worker.h"

namespace dtensor::backend_detail {

class StatsRecorder {
 public:
  explicit StatsRecorder(CommStats& rank_totals) : rank_totals_(&rank_totals) {}

  /// Notes when a call starts, for its trace event.
  void begin() {
    if (trace::current != nullptr || mesh_detail::deferred_records != nullptr) [[unlikely]]
      started_ = trace::Clock::now();
  }
  void record(CollectiveKind kind, std::uint64_t bytes) {
    if (mesh_detail::deferred_records != nullptr) [[unlikely]] {
      mesh_detail::deferred_records->push_back({kind, bytes, false, {}, std::exchange(started_, {}), trace::Clock::now()});
      return;
    }
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
    const std::uint64_t sequence = messages_[route(sending, self, peer, tag)]++;
    if (mesh_detail::deferred_records != nullptr) [[unlikely]] {
      mesh_detail::deferred_records->push_back({kind, bytes, true, trace::MessageEnd{sending, self, peer, tag, sequence},
                                                std::exchange(started_, {}), trace::Clock::now()});
      return;
    }
    own_.record(kind, bytes);
    rank_totals_->record(kind, bytes);
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
  /// On the rank's thread, when it waits for a started call: counts what the
  /// call recorded on the worker, as record() and record_message() would have.
  /// `issued`: when the rank started the call (the epoch if not recording).
  void apply(const std::vector<mesh_detail::DeferredRecord>& records, trace::Clock::time_point issued) {
    for (const auto& r : records) {
      own_.record(r.kind, r.bytes);
      rank_totals_->record(r.kind, r.bytes);
      if (trace::current == nullptr) [[likely]]
        continue;
      if (r.message)
        trace::record_message(&own_, r.end, r.bytes, r.start, r.finish, issued);
      else
        trace::record_collective(&own_, r.kind, r.bytes, r.start, r.finish, issued);
    }
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
