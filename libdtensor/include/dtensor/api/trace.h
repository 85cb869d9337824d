#pragma once
// Traces: what each rank did, when, as a Chrome trace (open the file in
// https://ui.perfetto.dev or chrome://tracing).
//
//   {
//     dtensor::TraceScope trace(mesh, "step.json");   // on every rank
//     auto y = dtensor::matmul(x, w);
//     y = y.redistribute({dtensor::Replicate()});
//   }  // rank 0 writes step.json with every rank's events
//
// One process per rank (named by its mesh coordinate), each with an "ops"
// track (one event per dispatched DTensor op, with the layouts it ran on)
// and a "collectives" track (one event per collective this rank called,
// named as collective_name() prints its kind, with the bytes it received
// as CommStats counts them, the mesh dims of its group and, inside a
// redistribution, the plan step it runs for, and the group's processes as
// "ranks"), and a "scopes" track (one event per CommScope region: the
// program's "forward", the backward's and the optimizer step's own). The
// trace has as many collective events of each kind as CommCounter counts
// over the same scope.
// Point-to-point messages (Communicator::send/recv, on a mesh's
// communicators) are send and recv events naming their direction, peer and tag,
// and each send is joined to its recv by a flow arrow across the two ranks'
// processes; a message whose other end ran outside the scope gets none. The
// library's own ops and plans move data only by collectives, which have no
// arrows.
//
// Without a TraceScope nothing is recorded, at the cost of one thread-local
// test per op and per collective. Setting DTENSOR_TRACE=FILE records the
// whole run of a program started by launch().
#include <memory>
#include <string>

#include "dtensor/mesh/device_mesh.h"

namespace dtensor {

namespace trace {
class Recorder;
class ScopeSpan;
}  // namespace trace

class TraceScope {
 public:
  /// Starts recording this rank's ops and collectives. A collective scope:
  /// every rank of `mesh` makes one, and finish() gathers their events on
  /// rank 0, which writes `path`. Scopes nest (the events go to both).
  /// ValueError for an empty path.
  TraceScope(const DeviceMesh& mesh, std::string path);
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;
  /// finish() unless it ran, swallowing its errors (call finish() to see
  /// them); while an exception unwinds, only stops recording, since the
  /// other ranks may never reach their finish().
  ~TraceScope();

  /// Collective over the mesh: stops recording and writes the file; returns
  /// when it is complete, on every rank. Error naming the path when rank 0
  /// cannot write it. A second call does nothing.
  void finish();
  /// Events recorded so far on this rank (ops and collectives, not the
  /// metadata naming processes and tracks).
  std::size_t recorded_events() const;
  const std::string& path() const { return path_; }

 private:
  DeviceMesh mesh_;
  std::string path_;
  int exceptions_at_start_;
  std::unique_ptr<trace::Recorder> recorder_;
};

/// Whether a TraceScope (or DTENSOR_TRACE) is recording on this thread.
bool trace_recording();

/// Names a region of this rank's work on the trace's "scopes" track while a
/// TraceScope records (the pipeline runtime's actions, "1F3"); unlike
/// CommScope it adds nothing to a CommTree. When nothing records: one
/// thread-local read, and `name` is never built.
class TraceRegion {
 public:
  template <class MakeName>
  explicit TraceRegion(MakeName&& make_name) {
    if (trace_recording()) [[unlikely]]
      open(make_name());
  }
  TraceRegion(const TraceRegion&) = delete;
  TraceRegion& operator=(const TraceRegion&) = delete;
  ~TraceRegion();

 private:
  void open(const std::string& name);
  // Owned; a plain pointer so that the inline constructor needs no complete type.
  trace::ScopeSpan* span_ = nullptr;
};

}  // namespace dtensor
