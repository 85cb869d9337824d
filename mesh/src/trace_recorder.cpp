// Chrome trace event JSON ("JSON object format"): {"traceEvents": [...]},
// each op or collective one complete event ("ph": "X", ts and dur in
// microseconds), each rank one process (pid = its rank in the world given),
// named by a metadata event, with one thread per track. Perfetto and
// chrome://tracing open it as it is.
#include "dtensor/mesh/detail/trace_recorder.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtensor/core/error.h"

namespace dtensor::trace {

constinit thread_local Recorder* current = nullptr;

namespace {

std::int64_t nanoseconds(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// Microseconds with nanosecond digits, as the format's "ts" and "dur" take.
std::string microseconds(std::int64_t ns) { return fmt::format("{:.3f}", static_cast<double>(ns) / 1000.0); }

// Each track's thread name and its events' category ("cat").
struct TrackText {
  std::string_view name, category;
};
TrackText track_text(Track track) {
  switch (track) {
    case Track::Ops: return {"ops", "op"};
    case Track::Collectives: return {"collectives", "collective"};
    case Track::Scopes: return {"scopes", "scope"};
  }
  return {"?", "?"};
}

constinit thread_local ScopeSpan* innermost_scope = nullptr;

// Every rank's text gathered on every rank, through the host-buffer
// collectives (which stage through device memory on GPU communicators), as
// equal-size blocks padded to the longest.
std::vector<std::string> gather_texts(Communicator& world, const std::string& text) {
  const auto n = static_cast<std::size_t>(world.size());
  const std::uint64_t mine = text.size();
  std::vector<std::uint64_t> lengths(n);
  world.all_gather_host(&mine, lengths.data(), sizeof(mine));
  const std::size_t block = static_cast<std::size_t>(*std::max_element(lengths.begin(), lengths.end()));
  std::string padded = text;
  padded.resize(block);
  std::string all(block * n, '\0');
  if (block > 0) world.all_gather_host(padded.data(), all.data(), block);
  std::vector<std::string> out;
  out.reserve(n);
  for (std::size_t r = 0; r < n; ++r) out.push_back(all.substr(r * block, static_cast<std::size_t>(lengths[r])));
  return out;
}

// A rank's text in the gather: its events as JSON, then this separator
// (which json_quote escapes, so no event holds it), then one line per flow
// end: "id s|f ts".
constexpr char kFlowSection = '\x1e';

struct FlowAt {
  std::size_t pid = 0;
  std::string ts;
};

// The flow arrows of every rank's flow lines: one start ("s", bound to the
// send's event) and one finish ("f" bound to the enclosing slice, the
// recv's event) per message whose two ends were both recorded; an end whose
// other end ran outside the recording (or on a rank not traced) is dropped,
// so every arrow in the file is paired.
std::string flow_events(const std::vector<std::string_view>& flow_sections) {
  std::map<std::uint64_t, std::pair<std::vector<FlowAt>, std::vector<FlowAt>>> ends;  // id: starts, finishes
  for (std::size_t pid = 0; pid < flow_sections.size(); ++pid) {
    std::string_view rest = flow_sections[pid];
    while (!rest.empty()) {
      const std::size_t eol = rest.find('\n');
      const std::string_view line = rest.substr(0, eol);
      rest = eol == std::string_view::npos ? std::string_view() : rest.substr(eol + 1);
      const std::size_t a = line.find(' '), b = line.find(' ', a + 1);
      if (a == std::string_view::npos || b == std::string_view::npos) continue;
      const std::uint64_t id = std::stoull(std::string(line.substr(0, a)));
      auto& side = line[a + 1] == 's' ? ends[id].first : ends[id].second;
      side.push_back(FlowAt{pid, std::string(line.substr(b + 1))});
    }
  }
  std::string out;
  for (const auto& [id, both] : ends) {
    const auto& [starts, finishes] = both;
    for (std::size_t i = 0; i < std::min(starts.size(), finishes.size()); ++i) {
      out += fmt::format(
          ",\n{{\"name\": \"message\", \"cat\": \"message\", \"ph\": \"s\", \"id\": {}, \"ts\": {}, "
          "\"pid\": {}, \"tid\": {}}}",
          id, starts[i].ts, starts[i].pid, static_cast<int>(Track::Collectives));
      out += fmt::format(
          ",\n{{\"name\": \"message\", \"cat\": \"message\", \"ph\": \"f\", \"bp\": \"e\", \"id\": {}, "
          "\"ts\": {}, \"pid\": {}, \"tid\": {}}}",
          id, finishes[i].ts, finishes[i].pid, static_cast<int>(Track::Collectives));
    }
  }
  return out;
}

// Rank 0's part of finish(): the merged file. Returns an empty string on
// success, else why it failed.
std::string write_trace(const std::string& path, const std::vector<std::string>& rank_texts) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return fmt::format("cannot open it for writing: {}", std::strerror(errno));
  out << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  bool first = true;
  std::vector<std::string_view> flow_sections;
  for (const std::string_view text : rank_texts) {
    const std::size_t split = std::min(text.find(kFlowSection), text.size());
    flow_sections.push_back(split < text.size() ? text.substr(split + 1) : std::string_view());
    if (split == 0) continue;
    if (!first) out << ",\n";
    out << text.substr(0, split);
    first = false;
  }
  out << flow_events(flow_sections);
  out << "\n]}\n";
  out.close();
  if (!out) return fmt::format("writing it failed: {}", std::strerror(errno));
  return {};
}

// The flow arrows' key: the same on both ends of one message, different for
// every other message (FNV-1a of the route, cut to 53 bits so a JSON reader
// holds it exactly as a double).
std::uint64_t flow_id(std::string_view route) {
  std::uint64_t h = 1469598103934665603ULL;
  for (const char c : route) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ULL;
  }
  return h & ((std::uint64_t{1} << 53) - 1);
}

}  // namespace

std::string json_quote(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 2);
  out += '"';
  for (const char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20)
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(static_cast<unsigned char>(c)));
        else
          out += c;
    }
  }
  out += '"';
  return out;
}

Recorder::Recorder(Communicator& world) : world_(&world), outer_(current), started_(Clock::now()) { current = this; }

Recorder::~Recorder() { stop(); }

void Recorder::stop() {
  if (!recording_) return;
  recording_ = false;
  if (current == this) {
    current = outer_;
    return;
  }
  // Scopes end in reverse order of their start; should this one end while
  // a recording nested in it still runs, that one now nests in this one's
  // outer, so that nothing is left pointing here once this is gone.
  for (Recorder* r = current; r != nullptr; r = r->outer_)
    if (r->outer_ == this) {
      r->outer_ = outer_;
      break;
    }
}

void Recorder::abandon() {
  stop();
  finished_ = true;
}

void Recorder::add(const Event& event) {
  for (Recorder* r = this; r != nullptr; r = r->outer_)
    if (r->recording_) r->events_.push_back(event);
}

void Recorder::name_group(const CommStats* group, std::string label, std::vector<int> members) {
  group_names_[group] = GroupName{std::move(label), std::move(members)};
}

void Recorder::add_flow(const FlowEnd& flow) {
  for (Recorder* r = this; r != nullptr; r = r->outer_)
    if (r->recording_) r->flows_.push_back(flow);
}

void Recorder::name_process(std::string name, bool replace) {
  for (Recorder* r = this; r != nullptr; r = r->outer_)
    if (replace || r->process_name_.empty()) r->process_name_ = name;
}

std::string Recorder::group_label(const CommStats* group) const {
  for (const Recorder* r = this; r != nullptr; r = r->outer_) {
    const auto it = r->group_names_.find(group);
    if (it != r->group_names_.end()) return it->second.label;
  }
  return "a communicator outside the traced meshes";
}

const std::vector<int>& Recorder::group_members(const CommStats* group) const {
  static const std::vector<int> unknown;
  for (const Recorder* r = this; r != nullptr; r = r->outer_) {
    const auto it = r->group_names_.find(group);
    if (it != r->group_names_.end()) return it->second.members;
  }
  return unknown;
}

std::string Recorder::rank_text(std::int64_t origin_ns) const {
  const int rank = world_->rank();
  const std::string name = process_name_.empty() ? fmt::format("rank {}", rank) : process_name_;
  std::string out = fmt::format(
      "{{\"name\": \"process_name\", \"ph\": \"M\", \"ts\": 0, \"pid\": {0}, \"tid\": 0, \"args\": {{\"name\": "
      "{1}}}}},\n"
      "{{\"name\": \"process_sort_index\", \"ph\": \"M\", \"ts\": 0, \"pid\": {0}, \"tid\": 0, "
      "\"args\": {{\"sort_index\": {0}}}}}",
      rank, json_quote(name));
  for (const Track track : {Track::Ops, Track::Collectives, Track::Scopes})
    out += fmt::format(
        ",\n{{\"name\": \"thread_name\", \"ph\": \"M\", \"ts\": 0, \"pid\": {}, \"tid\": {}, \"args\": {{\"name\": "
        "\"{}\"}}}}",
        rank, static_cast<int>(track), track_text(track).name);
  for (const Event& e : events_) {
    const std::int64_t dur_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(e.duration).count();
    out += fmt::format(
        ",\n{{\"name\": {}, \"cat\": \"{}\", \"ph\": \"X\", \"ts\": {}, \"dur\": {}, \"pid\": {}, \"tid\": {}, "
        "\"args\": {{{}}}}}",
        json_quote(e.name), track_text(e.track).category, microseconds(nanoseconds(e.start) - origin_ns),
        microseconds(std::max<std::int64_t>(dur_ns, 0)), rank, static_cast<int>(e.track), e.args);
  }
  out += kFlowSection;
  for (const FlowEnd& f : flows_)
    out += fmt::format("{} {} {}\n", f.id, f.start ? 's' : 'f', microseconds(nanoseconds(f.at) - origin_ns));
  return out;
}

void Recorder::finish(const std::string& path) {
  stop();
  if (finished_) return;
  finished_ = true;
  // One origin for all ranks: the earliest start. steady_clock is one clock
  // for the threads of a process and for the processes of one machine.
  const std::int64_t mine = nanoseconds(started_);
  std::vector<std::int64_t> starts(static_cast<std::size_t>(world_->size()));
  world_->all_gather_host(&mine, starts.data(), sizeof(mine));
  const std::int64_t origin = *std::min_element(starts.begin(), starts.end());
  const auto texts = gather_texts(*world_, rank_text(origin));
  std::string failure;
  if (world_->rank() == 0) failure = write_trace(path, texts);
  // Every rank learns whether the file is there, so none returns before it
  // is complete and all fail together when it is not.
  std::uint8_t failed = failure.empty() ? 0 : 1;
  world_->broadcast_host(&failed, sizeof(failed), 0);
  if (failed)
    throw Error(fmt::format("[trace] rank 0 could not write the trace to '{}'{}", path,
                            failure.empty() ? std::string() : ": " + failure));
}

namespace {
// A started call's wait on the rank's worker before it began, as an arg.
// A started call's args: how long it queued on the rank's worker before it
// began, and when the rank's wait for it returned (now: the record is
// applied by the wait, on the rank's thread), each after its issue.
std::string queued_arg(Clock::time_point issued, Clock::time_point start) {
  if (issued == Clock::time_point{}) return {};
  const std::int64_t queued_ns = std::max<std::int64_t>(nanoseconds(start) - nanoseconds(issued), 0);
  const std::int64_t returned_ns = std::max<std::int64_t>(nanoseconds(Clock::now()) - nanoseconds(issued), 0);
  return fmt::format(", \"queued_us\": {}, \"returned_us\": {}", microseconds(queued_ns), microseconds(returned_ns));
}
}  // namespace

void record_collective(const CommStats* group, CollectiveKind kind, std::uint64_t bytes, Clock::time_point start,
                       Clock::time_point finish, Clock::time_point issued) {
  Recorder* r = current;
  const auto end = finish == Clock::time_point{} ? Clock::now() : finish;
  if (start == Clock::time_point{}) start = end;
  std::string args = fmt::format("\"bytes\": {}, \"group\": {}", bytes, json_quote(r->group_label(group)));
  // The group's processes: the same list on every member, so a reader can
  // tell one call of a collective on all its ranks (the n-th event of this
  // group on each), as timeline_svg does to line them up.
  if (const auto& members = r->group_members(group); !members.empty())
    args += fmt::format(", \"ranks\": [{}]", fmt::join(members, ", "));
  if (!r->plan_step().empty()) args += fmt::format(", \"plan_step\": {}", json_quote(r->plan_step()));
  args += queued_arg(issued, start);
  r->add(Event{std::string(collective_name(kind)), Track::Collectives, start, end - start, std::move(args)});
}

void record_message(const CommStats* group, const MessageEnd& end, std::uint64_t bytes, Clock::time_point start,
                    Clock::time_point ended, Clock::time_point issued) {
  Recorder* r = current;
  const auto finish = ended == Clock::time_point{} ? Clock::now() : ended;
  if (start == Clock::time_point{}) start = finish;
  const std::vector<int>& members = r->group_members(group);
  const auto in_range = [&](int rank) { return rank >= 0 && static_cast<std::size_t>(rank) < members.size(); };
  const bool known = in_range(end.self) && in_range(end.peer);
  // The peer as the trace shows it: its process (world rank) where the
  // group's members are known, else its rank in the group.
  const int peer = known ? members[static_cast<std::size_t>(end.peer)] : end.peer;
  const std::string label = r->group_label(group);
  std::string args =
      fmt::format("\"bytes\": {}, \"group\": {}, \"direction\": \"{}\", \"{}\": {}, \"tag\": {}", bytes,
                  json_quote(label), end.sending ? "send" : "recv", known ? "peer" : "peer_in_group", peer, end.tag);
  if (!r->plan_step().empty()) args += fmt::format(", \"plan_step\": {}", json_quote(r->plan_step()));
  args += queued_arg(issued, start);
  r->add(Event{std::string(collective_name(end.sending ? CollectiveKind::Send : CollectiveKind::Recv)),
               Track::Collectives, start, finish - start, std::move(args)});
  if (!known) return;
  const int self = members[static_cast<std::size_t>(end.self)];
  const std::string route = fmt::format("{} [{}] {}>{} tag {} #{}", label, fmt::join(members, ","),
                                        end.sending ? self : peer, end.sending ? peer : self, end.tag, end.sequence);
  // The arrow leaves the send where it starts and reaches the recv just
  // before it ends (inside it, as a finish bound to its enclosing slice
  // must be), so it points forward in time.
  const auto lands = finish - start >= std::chrono::nanoseconds(2) ? finish - std::chrono::nanoseconds(1) : start;
  r->add_flow(FlowEnd{flow_id(route), end.sending, end.sending ? start : lands});
}

void OpSpan::begin(std::string_view name) {
  recorder_ = current;
  name_ = name;
  start_ = Clock::now();
}

void OpSpan::note(std::string_view key, std::string_view json_value) {
  if (!args_.empty()) args_ += ", ";
  args_ += json_quote(key);
  args_ += ": ";
  args_ += json_value;
}

void OpSpan::end() noexcept {
  try {
    recorder_->add(Event{std::string(name_), Track::Ops, start_, Clock::now() - start_, std::move(args_)});
  } catch (...) {
    // Out of memory while recording: the trace loses this op rather than
    // the op failing (a destructor must not throw).
  }
}

std::unique_ptr<ScopeSpan> ScopeSpan::open(std::string_view name) {
  if (current == nullptr) return nullptr;
  if (innermost_scope != nullptr && innermost_scope->name_ == name) return nullptr;
  return std::unique_ptr<ScopeSpan>(new ScopeSpan(current, name));
}

ScopeSpan::ScopeSpan(Recorder* recorder, std::string_view name)
    : recorder_(recorder), name_(name), start_(Clock::now()), outer_(innermost_scope) {
  innermost_scope = this;
}

ScopeSpan::~ScopeSpan() {
  if (innermost_scope == this) {
    innermost_scope = outer_;
  } else {  // closed before a region opened inside it (out of order): unlinked as Recorder::stop does
    for (ScopeSpan* span = innermost_scope; span != nullptr; span = span->outer_)
      if (span->outer_ == this) {
        span->outer_ = outer_;
        break;
      }
  }
  // Its recording ended meanwhile (or another began, perhaps at the same
  // address, which started after this region did).
  if (current != recorder_ || start_ < recorder_->started()) return;
  try {
    recorder_->add(Event{name_, Track::Scopes, start_, Clock::now() - start_, {}});
  } catch (...) {
    // Out of memory while recording: the trace loses this region.
  }
}

void PlanStepLabel::restore() noexcept { recorder_->set_plan_step(std::move(previous_)); }

}  // namespace dtensor::trace
