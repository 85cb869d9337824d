// A pipelined step's trace drawn as measured (pipeline_picture.h).
#include "dtensor/train/pipeline_picture.h"

#include <algorithm>
#include <limits>
#include <map>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <dtensor/core/error.h>
#include <dtensor/pictures/svg.h>

namespace dtensor::train {

namespace pipe = nn::pipeline;

const char* box_kind(pipe::ActionKind kind) {
  switch (kind) {
    case pipe::ActionKind::Forward: return "forward";
    case pipe::ActionKind::Backward: return "backward";
    case pipe::ActionKind::BackwardInput: return "input_backward";
    case pipe::ActionKind::BackwardWeight: return "weight_backward";
    default: return "message";
  }
}

std::string pipeline_step_svg(const std::string& trace_json, const pipe::Schedule& schedule, const std::string& title) {
  const nlohmann::json trace = nlohmann::json::parse(trace_json, nullptr, /*allow_exceptions=*/false);
  if (!trace.is_object() || !trace.contains("traceEvents"))
    throw ParseError("[pipeline picture] the trace is not a Chrome trace JSON object with \"traceEvents\"");
  std::vector<pictures::ScheduleRow> rows(static_cast<std::size_t>(schedule.ranks()));
  std::vector<std::map<std::string, pipe::Action>> compute(rows.size());
  for (std::size_t rank = 0; rank < rows.size(); ++rank) {
    rows[rank].name = fmt::format("rank {}", rank);
    for (const pipe::Action& a : schedule.actions[rank])
      if (pipe::is_compute(a.kind)) compute[rank][pipe::action_text(a)] = a;
  }
  double start = std::numeric_limits<double>::infinity();
  for (const auto& e : trace["traceEvents"])
    if (e.value("ph", "") == "X") start = std::min(start, e["ts"].get<double>());
  for (const auto& e : trace["traceEvents"]) {
    if (e.value("ph", "") != "X" || e.value("cat", "") != "scope") continue;
    const auto rank = e["pid"].get<std::size_t>();
    if (rank >= rows.size()) continue;  // a rank of another mesh dim's pipeline: its pp rank is not its pid
    const auto action = compute[rank].find(e["name"].get<std::string>());
    if (action == compute[rank].end()) continue;  // a message, or a region inside an action
    const double from = (e["ts"].get<double>() - start) / 1e3, to = from + e["dur"].get<double>() / 1e3;
    rows[rank].boxes.push_back({action->first, box_kind(action->second.kind), from, to,
                                fmt::format("{}: {:.2f} to {:.2f} ms", action->first, from, to)});
  }
  pictures::SchedulePictureOptions options;
  options.title = title;
  options.subtitle =
      fmt::format("milliseconds, as the trace recorded them on {} cores; hatched: waiting for a message (the bubble)",
                  std::thread::hardware_concurrency());
  return pictures::schedule_svg(rows, options);
}

}  // namespace dtensor::train
