// A timeline picture of a Chrome trace (TraceScope, DTENSOR_TRACE): one row
// per rank with an ops lane and a collectives lane, collectives coloured by
// kind. On the logical clock every op takes one unit and every collective
// three, and a collective starts on all its ranks once the last of them has
// reached it: the picture shows the order and the waiting, and is the same
// on every run of the same program, so it can be committed and compared.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "dtensor/core/error.h"
#include "dtensor/core/units.h"
#include "draw.h"

namespace dtensor::pictures {

namespace {

using nlohmann::json;

constexpr double kMargin = 12;
constexpr double kLane = 16;
constexpr double kRowGap = 14;
constexpr double kOpUnits = 1;
constexpr double kCollectiveUnits = 3;

struct Slice {
  std::string name;
  bool collective = false;
  bool scope = false;      // a named region (forward, backward, optimizer)
  double ts = 0, dur = 0;  // as recorded, microseconds
  std::string group;       // collectives: their group's label
  std::vector<int> ranks;  // collectives: their group's processes, when recorded
  std::string tooltip;
  int depth = 0;          // ops: how many ops enclose it
  double x0 = 0, x1 = 0;  // on the picture's clock
  int instance = -1;      // collectives: which call across ranks, once lined up
};

struct Rank {
  int pid = 0;
  std::string name;
  std::vector<Slice> slices;
};

std::string kind_colour(std::string_view kind) {
  static const std::map<std::string_view, std::string_view> colours{{"all_reduce", "#d9534f"},
                                                                    {"all_gather", "#337ab7"},
                                                                    {"reduce_scatter", "#4cae4c"},
                                                                    {"all_to_all", "#8e6bbf"},
                                                                    {"broadcast", "#f0ad4e"},
                                                                    {"scatter", "#e08e45"},
                                                                    {"send", "#777777"},
                                                                    {"recv", "#999999"}};
  const auto it = colours.find(kind);
  return std::string(it == colours.end() ? "#bbbbbb" : it->second);
}

[[noreturn]] void bad_trace(std::string_view why) {
  throw ValueError(
      fmt::format("[pictures] timeline_svg: {}; expected a Chrome trace as TraceScope writes it "
                  "(an object with a traceEvents array of events with ph, ts, pid and tid)",
                  why));
}

// A JSON integer that fits an int (a pid or a rank), else nothing: a float
// or a huge number would not convert to int safely.
std::optional<int> small_integer(const json& v) {
  if (!v.is_number_integer()) return std::nullopt;
  const auto n = v.get<std::int64_t>();
  if (n < std::numeric_limits<int>::min() || n > std::numeric_limits<int>::max()) return std::nullopt;
  return static_cast<int>(n);
}

std::string tooltip_of(const json& e, const json& args, bool collective) {
  std::string out = e.value("name", std::string());
  auto text = [](const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); };
  if (collective) {
    if (args.contains("group")) out += fmt::format(" on {}", text(args["group"]));
    if (args.contains("bytes"))
      out += args["bytes"].is_number_integer() && args["bytes"].get<std::int64_t>() >= 0
                 ? fmt::format(", {} received", human_bytes(args["bytes"].get<std::int64_t>()))
                 : fmt::format(", {} bytes received", text(args["bytes"]));
    if (args.contains("plan_step")) out += fmt::format("\n{}", text(args["plan_step"]));
  } else {
    for (const auto& [key, value] : args.items()) out += fmt::format("\n{}: {}", key, text(value));
  }
  return out;
}

// One event into its rank: a process name, or a complete event as a slice;
// other phases are skipped. nlohmann's type errors (a name that is not a
// string, ...) are the caller's to turn into ValueError.
void read_event(const json& e, std::map<int, Rank>& ranks) {
  const std::optional<int> pid = e.is_object() && e.contains("pid") ? small_integer(e["pid"]) : std::nullopt;
  if (!pid || !e.contains("ph") || !e["ph"].is_string())
    bad_trace(fmt::format("the event {} has no ph or integer pid", e.dump()));
  const std::string ph = e["ph"];
  Rank& rank = ranks[*pid];
  rank.pid = *pid;
  const json args = e.value("args", json::object());
  if (ph == "M" && e.value("name", "") == "process_name") rank.name = args.value("name", "");
  if (ph != "X") return;
  if (!e.contains("ts") || !e["ts"].is_number() || !e.contains("dur") || !e["dur"].is_number())
    bad_trace(fmt::format("the complete event {} has no numeric ts and dur", e.dump()));
  Slice s;
  s.name = e.value("name", "");
  s.collective = e.value("cat", "") == "collective";
  s.scope = e.value("cat", "") == "scope";
  s.ts = e["ts"];
  s.dur = std::max(0.0, e["dur"].get<double>());
  s.tooltip = tooltip_of(e, args, s.collective);
  if (s.collective) {
    s.group = args.value("group", "");
    if (args.contains("ranks")) {
      if (!args["ranks"].is_array()) bad_trace(fmt::format("the event {} has ranks that are not a list", e.dump()));
      for (const json& r : args["ranks"]) {
        const std::optional<int> member = small_integer(r);
        if (!member) bad_trace(fmt::format("the event {} lists a rank that is not an integer", e.dump()));
        s.ranks.push_back(*member);
      }
    }
  }
  rank.slices.push_back(std::move(s));
}

// The ranks of a trace with their complete events in program order: by
// start, an enclosing op before what it encloses.
std::vector<Rank> read_ranks(std::string_view trace_json) {
  json trace;
  try {
    trace = json::parse(trace_json);
  } catch (const json::exception& e) {
    bad_trace(fmt::format("the text is not JSON ({})", e.what()));
  }
  const json* events = trace.is_array() ? &trace : nullptr;
  if (trace.is_object() && trace.contains("traceEvents") && trace["traceEvents"].is_array())
    events = &trace["traceEvents"];
  if (events == nullptr) bad_trace("there is no traceEvents array");
  std::map<int, Rank> ranks;
  for (const json& e : *events) {
    try {
      read_event(e, ranks);
    } catch (const json::exception& error) {
      bad_trace(fmt::format("the event {} has a field of the wrong type ({})", e.dump(), error.what()));
    }
  }
  std::vector<Rank> out;
  for (auto& [pid, rank] : ranks) {
    if (rank.name.empty()) rank.name = fmt::format("rank {}", pid);
    std::stable_sort(rank.slices.begin(), rank.slices.end(), [](const Slice& a, const Slice& b) {
      if (a.ts != b.ts) return a.ts < b.ts;
      if (a.dur != b.dur) return a.dur > b.dur;
      return !a.collective && b.collective;
    });
    // Depth of each op: the ops still open where it starts.
    std::vector<double> open_ends;
    for (Slice& s : rank.slices) {
      while (!open_ends.empty() && open_ends.back() <= s.ts) open_ends.pop_back();
      s.depth = static_cast<int>(open_ends.size());
      if (!s.collective && !s.scope) open_ends.push_back(s.ts + s.dur);
    }
    out.push_back(std::move(rank));
  }
  return out;
}

// The logical clock. Each rank walks its events in order with a cursor; an
// op (or a scope) opens at the cursor and, when nothing ran inside it,
// closes one unit later (a scope three); a collective waits until every
// rank of its group (those in the trace) has reached the same call (the
// n-th event of that group on each), then runs on all of them from the
// latest arrival for three units. Should the calls not match (a trace cut
// short), the earliest waiting call goes ahead with the ranks it has, so
// this always ends. Returns the calls that lined up, each as its ranks'
// (rank index, slice index).
std::vector<std::vector<std::pair<std::size_t, std::size_t>>> logical_clock(std::vector<Rank>& ranks) {
  struct Open {
    std::size_t slice;
    bool had_inner = false;
  };
  struct Walker {
    std::size_t next = 0;
    double cursor = 0;
    std::vector<Open> open;
    std::map<std::string, int> calls;  // per group: calls reached so far
    std::optional<std::string> waiting;
  };
  struct Call {
    std::vector<std::pair<std::size_t, std::size_t>> arrived;  // (rank index, slice index)
    double latest = 0;
    std::set<std::size_t> expected;
  };
  std::map<int, std::size_t> index_of_pid;
  for (std::size_t i = 0; i < ranks.size(); ++i) index_of_pid[ranks[i].pid] = i;
  std::vector<Walker> walkers(ranks.size());
  std::map<std::string, Call> calls;
  std::vector<std::vector<std::pair<std::size_t, std::size_t>>> lined_up;

  auto close_until = [&](std::size_t r, double ts, bool all) {
    Walker& w = walkers[r];
    while (!w.open.empty()) {
      Slice& op = ranks[r].slices[w.open.back().slice];
      if (!all && op.ts + op.dur > ts) break;
      // An empty region (an optimizer step of fused loops, no ops) is as
      // wide as a collective, so that its name fits.
      if (!w.open.back().had_inner) w.cursor = op.x0 + (op.scope ? kCollectiveUnits : kOpUnits);
      op.x1 = w.cursor;
      w.open.pop_back();
    }
  };
  auto run = [&](const std::string& key) {
    Call& call = calls[key];
    for (const auto& [r, s] : call.arrived) {
      Slice& slice = ranks[r].slices[s];
      slice.x0 = call.latest;
      slice.x1 = call.latest + kCollectiveUnits;
      slice.instance = static_cast<int>(lined_up.size());
      walkers[r].cursor = slice.x1;
      walkers[r].waiting.reset();
    }
    lined_up.push_back(std::move(call.arrived));
    calls.erase(key);
  };

  for (;;) {
    bool moved = false, unfinished = false;
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      Walker& w = walkers[r];
      while (!w.waiting && w.next < ranks[r].slices.size()) {
        const std::size_t s = w.next++;
        Slice& slice = ranks[r].slices[s];
        moved = true;
        close_until(r, slice.ts, false);
        if (!w.open.empty()) w.open.back().had_inner = true;
        if (!slice.collective) {
          slice.x0 = w.cursor;
          w.open.push_back(Open{s});
          continue;
        }
        if (slice.ranks.size() < 2) {  // nobody to wait for
          slice.x0 = w.cursor;
          slice.x1 = w.cursor += kCollectiveUnits;
          continue;
        }
        const std::string group = fmt::format("{} [{}]", slice.group, fmt::join(slice.ranks, ","));
        const std::string key = fmt::format("{} #{}", group, w.calls[group]++);
        Call& call = calls[key];
        if (call.arrived.empty())
          for (int pid : slice.ranks)
            if (const auto it = index_of_pid.find(pid); it != index_of_pid.end()) call.expected.insert(it->second);
        call.arrived.emplace_back(r, s);
        call.latest = std::max(call.latest, w.cursor);
        w.waiting = key;
        if (call.arrived.size() >= call.expected.size()) run(key);
      }
      if (w.waiting || w.next < ranks[r].slices.size()) unfinished = true;
    }
    if (!unfinished) break;
    if (!moved) {  // every rank waits on a call some rank never makes
      const auto first = std::min_element(calls.begin(), calls.end(), [](const auto& a, const auto& b) {
        return a.second.latest < b.second.latest;
      });
      run(first->first);
    }
  }
  for (std::size_t r = 0; r < ranks.size(); ++r) close_until(r, 0, true);
  return lined_up;
}

void measured_clock(std::vector<Rank>& ranks) {
  for (Rank& rank : ranks)
    for (Slice& s : rank.slices) {
      s.x0 = s.ts;
      s.x1 = s.ts + s.dur;
    }
}

enum class Lane { Scopes, Ops, Collectives };

// Where a rank's lanes sit: a scopes lane on top when the trace has scopes
// (forward, backward, optimizer), then ops, then collectives.
struct RowLayout {
  double left = 0;  // where time starts
  bool scopes = false;
  double lane_y(double row_y, Lane lane) const {
    const int index = static_cast<int>(lane) - (scopes ? 0 : 1);
    return row_y + index * (kLane + 2);
  }
  double height() const { return (scopes ? 3 : 2) * (kLane + 2) - 2; }
};

template <class XOf>
std::string draw_rank(const Rank& rank, const RowLayout& row, double y, const XOf& x_of) {
  std::string out = fmt::format(R"(<g class="rank" data-pid="{}">)", rank.pid);
  out +=
      fmt::format(R"(<text x="{}" y="{:.1f}" font-size="11">{}</text>)", kMargin, y + kLane - 3, xml_escape(rank.name));
  std::vector<std::pair<Lane, const char*>> lanes{{Lane::Ops, "ops"}, {Lane::Collectives, "collectives"}};
  if (row.scopes) lanes.insert(lanes.begin(), {Lane::Scopes, "scopes"});
  for (const auto& [lane, name] : lanes)
    out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="9" fill="#777" text-anchor="end">{}</text>)",
                       row.left - 6, row.lane_y(y, lane) + kLane - 4, name);
  for (const Slice& slice : rank.slices) {
    const double x = x_of(slice.x0), w = std::max(x_of(slice.x1) - x, 1.0);
    const bool labelled = w >= static_cast<double>(slice.name.size()) * 5.6 + 4;
    if (slice.collective) {
      out +=
          fmt::format(R"(<g class="collective" data-kind="{}"><rect x="{:.2f}" y="{:.1f}" width="{:.2f}" height="{}" )"
                      R"(fill="{}" stroke="#333" stroke-width="0.4"/><title>{}</title></g>)",
                      xml_escape(slice.name), x, row.lane_y(y, Lane::Collectives), w, kLane, kind_colour(slice.name),
                      xml_escape(slice.tooltip));
    } else if (slice.scope) {
      const double top = row.lane_y(y, Lane::Scopes);
      out += fmt::format(R"(<g class="scope"><rect x="{:.2f}" y="{:.1f}" width="{:.2f}" height="{}" fill="#f3e9c6" )"
                         R"(stroke="#a38b3c" stroke-width="0.6"/>{}<title>{}</title></g>)",
                         x, top, w, kLane,
                         labelled ? fmt::format(R"(<text x="{:.2f}" y="{:.1f}" font-size="10">{}</text>)", x + 3,
                                                top + kLane - 4, xml_escape(slice.name))
                                  : std::string(),
                         xml_escape(slice.tooltip));
    } else {
      const double top = row.lane_y(y, Lane::Ops), inset = std::min(2.0 * slice.depth, kLane / 2 - 2);
      out += fmt::format(R"(<g class="op" data-depth="{}"><rect x="{:.2f}" y="{:.1f}" width="{:.2f}" height="{:.1f}" )"
                         R"(fill="#c9d6e8" stroke="#6f86a8" stroke-width="0.4"/>{}<title>{}</title></g>)",
                         slice.depth, x, top + inset, w, kLane - 2 * inset,
                         labelled ? fmt::format(R"(<text x="{:.2f}" y="{:.1f}" font-size="9">{}</text>)", x + 2,
                                                top + kLane - 4, xml_escape(slice.name))
                                  : std::string(),
                         xml_escape(slice.tooltip));
    }
  }
  return out + "</g>";
}

}  // namespace

std::string timeline_svg(std::string_view trace_json, const TimelineOptions& options) {
  if (!(options.width > 0) || !std::isfinite(options.width))
    throw ValueError(fmt::format("[pictures] timeline_svg: width {} px; expected a positive number", options.width));
  std::vector<Rank> ranks = read_ranks(trace_json);
  if (ranks.empty()) bad_trace("it has no events");
  std::vector<std::vector<std::pair<std::size_t, std::size_t>>> lined_up;
  if (options.clock == TimelineClock::Logical)
    lined_up = logical_clock(ranks);
  else
    measured_clock(ranks);

  double start = 0, end = 0;
  bool any = false;
  for (const Rank& rank : ranks)
    for (const Slice& s : rank.slices) {
      start = any ? std::min(start, s.x0) : s.x0;
      end = any ? std::max(end, s.x1) : s.x1;
      any = true;
    }
  const double span = std::max(end - start, 1e-9);
  std::size_t longest_name = 0;
  for (const Rank& rank : ranks) longest_name = std::max(longest_name, rank.name.size());
  const double left = kMargin + static_cast<double>(longest_name) * 6.6 + 80;
  const double scale = options.width / span;
  auto x_of = [&](double t) { return left + (t - start) * scale; };

  detail::Drawing d;
  const std::string title = options.title.empty() ? fmt::format("timeline of {} rank(s)", ranks.size()) : options.title;
  d.body += fmt::format(R"(<text class="title" x="{}" y="{}" font-size="15" font-weight="bold">{}</text>)", kMargin,
                        kMargin + 12, xml_escape(title));
  const std::string clock_text =
      options.clock == TimelineClock::Logical
          ? fmt::format(
                "logical time: each op one unit, each collective {:g}; a collective starts on all its ranks "
                "when the last of them reaches it",
                kCollectiveUnits)
          : fmt::format("measured time: {} from left to right", human_seconds(span * 1e-6));
  d.body += fmt::format(R"(<text class="clock" x="{}" y="{}" font-size="11" fill="#555">{}</text>)", kMargin,
                        kMargin + 30, xml_escape(clock_text));

  double y = kMargin + 46;
  std::map<std::pair<std::size_t, std::size_t>, double> lane_top;  // (rank, slice): its collective lane's top
  std::map<std::string, int> kinds;                                // calls of each kind on the rank that made the most
  for (const Rank& rank : ranks) {
    std::map<std::string, int> mine;
    for (const Slice& s : rank.slices)
      if (s.collective) ++mine[s.name];
    for (const auto& [kind, count] : mine) kinds[kind] = std::max(kinds[kind], count);
  }
  const bool any_scopes = std::any_of(ranks.begin(), ranks.end(), [](const Rank& rank) {
    return std::any_of(rank.slices.begin(), rank.slices.end(), [](const Slice& s) { return s.scope; });
  });
  const RowLayout row{left, any_scopes};
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    d.body += draw_rank(ranks[r], row, y, x_of);
    for (std::size_t s = 0; s < ranks[r].slices.size(); ++s)
      if (ranks[r].slices[s].collective) lane_top[{r, s}] = row.lane_y(y, Lane::Collectives);
    y += row.height() + kRowGap;
  }
  // One call across its ranks: a line through their boxes.
  for (const auto& members : lined_up) {
    if (members.size() < 2) continue;
    double top = 1e300, bottom = -1e300;
    for (const auto& m : members) {
      top = std::min(top, lane_top[m]);
      bottom = std::max(bottom, lane_top[m] + kLane);
    }
    const Slice& first = ranks[members[0].first].slices[members[0].second];
    const double x = x_of((first.x0 + first.x1) / 2);
    d.body += fmt::
        format(R"(<line class="sync" x1="{:.2f}" y1="{:.1f}" x2="{:.2f}" y2="{:.1f}" stroke="{}" stroke-width="1" )"
               R"(stroke-dasharray="2,2" stroke-opacity="0.7"/>)",
               x, top, x, bottom, kind_colour(first.name));
  }
  // The legend: each kind's colour and how many calls of it a rank made.
  double lx = kMargin;
  if (!kinds.empty()) {
    d.body +=
        fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="11" fill="#555">calls per rank:</text>)", lx, y + 10);
    lx += 100;
  }
  for (const auto& [kind, count] : kinds) {
    const std::string text = fmt::format("{} x{}", kind, count);
    d.body += fmt::format(R"(<g class="legend"><rect x="{:.1f}" y="{:.1f}" width="12" height="12" fill="{}"/>)"
                          R"(<text x="{:.1f}" y="{:.1f}" font-size="11">{}</text></g>)",
                          lx, y, kind_colour(kind), lx + 16, y + 10, xml_escape(text));
    lx += 16 + static_cast<double>(text.size()) * 6.6 + 14;
  }
  d.width =
      std::max({left + options.width + kMargin, lx + kMargin, static_cast<double>(title.size()) * 9.5 + 2 * kMargin,
                static_cast<double>(clock_text.size()) * 6.2 + 2 * kMargin});
  d.height = y + 12 + kMargin;
  return detail::svg_document(d);
}

}  // namespace dtensor::pictures
