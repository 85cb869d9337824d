#pragma once
// The recorder behind TraceScope (dtensor/api/trace.h) and DTENSOR_TRACE:
// a trace, each rank's ops and collectives in time, written as Chrome trace
// event JSON (pictures::timeline_svg draws one). Not installed: the layers
// that produce events (the backends' stats recorders, DeviceMesh, the op
// dispatcher, the plan executor) include it by path.
//
// Cost when nothing records: every hook first reads one thread-local
// pointer, `current`, which is null unless a recording is active on this
// thread (ranks are threads, or the one thread of an MPI process). It is
// constinit, so reading it calls no initialisation wrapper; the rest of each
// hook sits out of line behind that test. No allocation and no lock happen
// while it is null.
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/mesh/communicator.h"

namespace dtensor {
class DeviceMesh;
}

namespace dtensor::trace {

using Clock = std::chrono::steady_clock;

/// The track (Chrome trace "tid") of each event on its rank's process.
enum class Track : std::uint8_t { Ops = 1, Collectives = 2, Scopes = 3 };

/// One end of a point-to-point message, as a backend saw it: ranks of the
/// communicator, and how many messages from the same source to the same
/// destination with the same tag went before it on that communicator.
struct MessageEnd {
  bool sending = false;
  int self = 0;
  int peer = 0;
  int tag = 0;
  std::uint64_t sequence = 0;
};

/// A flow event's end: a send starts an arrow, its recv finishes it. Both
/// ends compute the same id from the message's route and sequence.
struct FlowEnd {
  std::uint64_t id = 0;
  bool start = false;
  Clock::time_point at;
};

struct Event {
  std::string name;
  Track track = Track::Ops;
  Clock::time_point start;
  Clock::duration duration{};
  /// Members of the event's "args" object, already JSON ("\"bytes\": 12").
  std::string args;
};

/// One rank's recording. Only the rank's own thread touches it.
class Recorder {
 public:
  /// Starts recording on this thread; recordings nest (events go to every
  /// recorder active on the thread). `world` is the communicator whose
  /// ranks the trace shows as processes; it must outlive finish().
  explicit Recorder(Communicator& world);
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;
  /// Stops recording if finish() did not; writes nothing.
  ~Recorder();

  /// Collective over world: stops recording, merges every rank's events and
  /// rank 0 writes them to `path` as one Chrome trace JSON object; returns
  /// once the file is complete on every rank. Error naming the path when
  /// rank 0 cannot write it (on every rank). A second call does nothing.
  void finish(const std::string& path);
  /// Stops recording without writing anything or talking to other ranks
  /// (when the rank is failing and its peers may never call finish).
  void abandon();
  /// When recording began.
  Clock::time_point started() const { return started_; }
  /// This rank's events so far, in the order they ended.
  const std::vector<Event>& events() const { return events_; }

  void add(const Event& event);
  /// How collectives on the communicator whose own_stats() is `group` are
  /// labelled ("mesh 2x2 dims [1]"), and its members' ranks in the world,
  /// in the order of their ranks in the group (empty when unknown: its
  /// messages then get no flow arrows); the latest label given wins.
  void name_group(const CommStats* group, std::string label, std::vector<int> members = {});
  /// A flow end on every recording active on the thread, as add() does.
  void add_flow(const FlowEnd& flow);
  /// The process name shown for this rank ("rank 3 at [1,1] of mesh 2x2");
  /// the first one given stays unless `replace`.
  void name_process(std::string name, bool replace);
  /// The plan step a collective runs for (empty outside a redistribution).
  void set_plan_step(std::string step) { plan_step_ = std::move(step); }
  const std::string& plan_step() const { return plan_step_; }
  std::string group_label(const CommStats* group) const;
  /// The members given with the label (empty when none were).
  const std::vector<int>& group_members(const CommStats* group) const;

 private:
  void stop();
  std::string rank_text(std::int64_t origin_ns) const;

  Communicator* world_;
  Recorder* outer_;  // the recording this one nests in, or null
  bool recording_ = true;
  bool finished_ = false;
  Clock::time_point started_;
  std::vector<Event> events_;
  struct GroupName {
    std::string label;
    std::vector<int> members;
  };
  std::map<const CommStats*, GroupName> group_names_;
  std::vector<FlowEnd> flows_;
  std::string process_name_;
  std::string plan_step_;
};

/// The innermost recording on this thread, or null.
extern constinit thread_local Recorder* current;

/// Labels the collectives on `mesh`'s communicators with its shape and dims
/// and names the rank by its coordinate (keeping an earlier name unless
/// `replace`). DeviceMesh's constructor calls it while recording.
void name_mesh(Recorder& recorder, const DeviceMesh& mesh, bool replace);

/// "\"text\"" with JSON escapes.
std::string json_quote(std::string_view text);

/// Called by a backend's StatsRecorder when a call ends while recording:
/// one event on the collectives track. `start` is the epoch when the
/// backend did not note the start (the event then has zero duration);
/// `finish`, now when it is the epoch (a started call's record, applied when
/// the rank waits for it, gives the time it really ended). `issued`, for a
/// started call: when the rank started it; the event's args then hold
/// "queued_us", how long it waited on the rank's worker behind earlier calls
/// before it began (the event itself spans the call's run), and
/// "returned_us", when the rank's wait for it returned, both after the
/// issue: the rank's ops that begin between the issue and the return ran
/// while the call was in flight, by program order, on any machine load.
void record_collective(const CommStats* group, CollectiveKind kind, std::uint64_t bytes, Clock::time_point start,
                       Clock::time_point finish = {}, Clock::time_point issued = {});

/// Called by a backend's StatsRecorder when a send or recv ends while
/// recording: one event on the collectives track, named as its kind (send
/// or recv) so that counts equal CommStats', with the direction, the
/// peer and the tag in its args; and, where the group's members are known,
/// one end of the flow arrow from the send to its recv.
void record_message(const CommStats* group, const MessageEnd& end, std::uint64_t bytes, Clock::time_point start,
                    Clock::time_point finish = {}, Clock::time_point issued = {});

/// One op on the ops track, from construction to destruction.
class OpSpan {
 public:
  explicit OpSpan(std::string_view name) {
    if (current != nullptr) [[unlikely]]
      begin(name);
  }
  OpSpan(const OpSpan&) = delete;
  OpSpan& operator=(const OpSpan&) = delete;
  ~OpSpan() {
    if (recorder_ != nullptr) [[unlikely]]
      end();
  }
  bool recording() const { return recorder_ != nullptr; }
  /// Adds "key": value (value already JSON) to the event's args.
  void note(std::string_view key, std::string_view json_value);

 private:
  void begin(std::string_view name);
  void end() noexcept;
  Recorder* recorder_ = nullptr;
  std::string_view name_;  // the op's registered name, which outlives the span
  Clock::time_point start_;
  std::string args_;
};

/// A named region of a step ("forward", "backward", "optimizer": the
/// CommScopes) on the scopes track, from open() to destruction. Made only
/// while recording, and not for a region named as the innermost one open on
/// the thread (as CommScope does not nest one in itself); dropped if the
/// recording it started in is no longer the thread's when it ends.
class ScopeSpan {
 public:
  /// Null when nothing records or `name` is the innermost open region's.
  static std::unique_ptr<ScopeSpan> open(std::string_view name);
  ScopeSpan(const ScopeSpan&) = delete;
  ScopeSpan& operator=(const ScopeSpan&) = delete;
  ~ScopeSpan();

 private:
  ScopeSpan(Recorder* recorder, std::string_view name);
  Recorder* recorder_;
  std::string name_;
  Clock::time_point start_;
  ScopeSpan* outer_;
};

/// Labels the collectives of one redistribution plan step while alive;
/// `make_text` is called only when recording.
class PlanStepLabel {
 public:
  template <class MakeText>
  explicit PlanStepLabel(MakeText&& make_text) {
    if (current != nullptr) [[unlikely]] {
      recorder_ = current;
      previous_ = recorder_->plan_step();
      recorder_->set_plan_step(make_text());
    }
  }
  PlanStepLabel(const PlanStepLabel&) = delete;
  PlanStepLabel& operator=(const PlanStepLabel&) = delete;
  ~PlanStepLabel() {
    if (recorder_ != nullptr) [[unlikely]]
      restore();
  }

 private:
  void restore() noexcept;
  Recorder* recorder_ = nullptr;
  std::string previous_;
};

}  // namespace dtensor::trace
