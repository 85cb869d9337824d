#include "dtensor/api/trace.h"

#include <exception>

#include <fmt/format.h>

#include "dtensor/core/error.h"
#include "dtensor/mesh/detail/trace_recorder.h"

namespace dtensor {

namespace {

std::string checked_path(std::string path) {
  if (path.empty()) throw ValueError("[trace] TraceScope: the path is empty; expected the file to write the trace to");
  return path;
}

}  // namespace

TraceScope::TraceScope(const DeviceMesh& mesh, std::string path)
    : mesh_(mesh),
      path_(checked_path(std::move(path))),
      exceptions_at_start_(std::uncaught_exceptions()),
      recorder_(std::make_unique<trace::Recorder>(mesh.comm())) {
  // The mesh names this rank's process and the groups its collectives run
  // on; a mesh built inside the scope adds its own groups.
  trace::name_mesh(*recorder_, mesh_, /*replace=*/true);
}

TraceScope::~TraceScope() {
  if (std::uncaught_exceptions() > exceptions_at_start_) {
    recorder_->abandon();
    return;
  }
  try {
    finish();
  } catch (...) {
    // A destructor must not throw; finish() called directly reports this.
  }
}

void TraceScope::finish() { recorder_->finish(path_); }

std::size_t TraceScope::recorded_events() const { return recorder_->events().size(); }

bool trace_recording() { return trace::current != nullptr; }

void TraceRegion::open(const std::string& name) { span_ = trace::ScopeSpan::open(name).release(); }
TraceRegion::~TraceRegion() { delete span_; }

}  // namespace dtensor
