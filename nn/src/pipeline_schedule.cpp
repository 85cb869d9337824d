// Actions and schedules as text: PyTorch's `{stage}{kind}{microbatch}`
// tokens, its CSV form, and the step-by-rank grid errors print.
#include <algorithm>
#include <array>
#include <charconv>
#include <utility>

#include <fmt/format.h>

#include "dtensor/core/error.h"
#include "dtensor/nn/pipeline.h"

namespace dtensor::nn::pipeline {

namespace {

struct KindName {
  ActionKind kind;
  std::string_view text;
};
// Longest first where one name is a prefix of another is not needed: the
// kind is the whole text between the two numbers.
constexpr std::array<KindName, 8> kKindNames{{{ActionKind::Forward, "F"},
                                              {ActionKind::Backward, "B"},
                                              {ActionKind::BackwardInput, "I"},
                                              {ActionKind::BackwardWeight, "W"},
                                              {ActionKind::SendForward, "SEND_F"},
                                              {ActionKind::RecvForward, "RECV_F"},
                                              {ActionKind::SendBackward, "SEND_B"},
                                              {ActionKind::RecvBackward, "RECV_B"}}};

bool is_digit(char c) { return c >= '0' && c <= '9'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// A non-negative decimal without sign or leading zeros (so that printing
// gives back the same text).
std::optional<int> parse_index(std::string_view digits) {
  if (digits.empty() || (digits.size() > 1 && digits.front() == '0')) return std::nullopt;
  int value = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return value;
}

std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  std::size_t start = 0;
  while (true) {
    std::size_t end = text.find(separator, start);
    parts.push_back(text.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) return parts;
    start = end + 1;
  }
}

}  // namespace

std::string_view kind_text(ActionKind kind) {
  for (const auto& [k, text] : kKindNames)
    if (k == kind) return text;
  return "?";
}

bool is_compute(ActionKind kind) {
  return kind == ActionKind::Forward || kind == ActionKind::Backward || kind == ActionKind::BackwardInput ||
         kind == ActionKind::BackwardWeight;
}

std::string action_text(const Action& action) {
  return fmt::format("{}{}{}", action.stage, kind_text(action.kind), action.microbatch);
}

Action parse_action(std::string_view token) {
  auto fail = [&](std::string_view why) {
    return ParseError(
        fmt::format("[pipeline] action '{}': {}; expected {{stage}}{{kind}}{{microbatch}} such as 0F3, "
                    "1B2 or 2SEND_F1, kinds F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B",
                    token, why));
  };
  std::size_t kind_begin = 0;
  while (kind_begin < token.size() && is_digit(token[kind_begin])) ++kind_begin;
  std::size_t kind_end = kind_begin;
  while (kind_end < token.size() && !is_digit(token[kind_end])) ++kind_end;
  auto stage = parse_index(token.substr(0, kind_begin));
  if (!stage) throw fail("no stage number (or one with a leading zero) at its start");
  auto microbatch = parse_index(token.substr(kind_end));
  if (!microbatch) throw fail("no microbatch number (or one with a leading zero) at its end");
  std::string_view kind = token.substr(kind_begin, kind_end - kind_begin);
  for (const auto& [k, text] : kKindNames)
    if (text == kind) return Action{*stage, k, *microbatch};
  throw fail(fmt::format("unknown kind '{}'", kind));
}

int Schedule::rank_of_stage(int stage) const {
  for (int rank = 0; rank < static_cast<int>(stages_of_rank.size()); ++rank)
    if (std::ranges::find(stages_of_rank[rank], stage) != stages_of_rank[rank].end()) return rank;
  throw ValueError(fmt::format("[pipeline] stage {} is on no rank (the schedule has {} stages on {} ranks)", stage,
                               stages, stages_of_rank.size()));
}

bool Schedule::has_communication() const {
  for (const auto& list : actions)
    for (const Action& a : list)
      if (!is_compute(a.kind)) return true;
  return false;
}

std::vector<std::vector<int>> looped_placement(int ranks, int stages_per_rank) {
  std::vector<std::vector<int>> placement(ranks);
  for (int rank = 0; rank < ranks; ++rank)
    for (int chunk = 0; chunk < stages_per_rank; ++chunk) placement[rank].push_back(chunk * ranks + rank);
  return placement;
}

std::vector<std::vector<int>> v_placement(int ranks) {
  std::vector<std::vector<int>> placement(ranks);
  for (int rank = 0; rank < ranks; ++rank) placement[rank] = {rank, 2 * ranks - 1 - rank};
  return placement;
}

std::string rank_text(const std::vector<Action>& actions) {
  std::string text;
  for (std::size_t i = 0; i < actions.size(); ++i) {
    if (i > 0) text += ',';
    text += action_text(actions[i]);
  }
  return text;
}

std::string to_csv(const Schedule& schedule) {
  std::string text;
  for (const auto& list : schedule.actions) text += rank_text(list) + '\n';
  return text;
}

Schedule from_csv(std::string_view text, std::optional<int> stages, std::optional<int> microbatches) {
  Schedule schedule;
  schedule.name = "csv";
  std::vector<std::string_view> rows = split(text, '\n');
  while (!rows.empty() && trim(rows.back()).empty()) rows.pop_back();
  int highest_stage = -1, highest_microbatch = -1;
  for (std::size_t rank = 0; rank < rows.size(); ++rank) {
    std::vector<Action>& list = schedule.actions.emplace_back();
    std::string_view row = trim(rows[rank]);
    if (row.empty()) continue;  // a rank with nothing to do
    std::vector<std::string_view> tokens = split(row, ',');
    for (std::size_t position = 0; position < tokens.size(); ++position) {
      try {
        list.push_back(parse_action(trim(tokens[position])));
      } catch (const ParseError& e) {
        throw ParseError(fmt::format("[pipeline] CSV rank {} (row {}), position {}: {}", rank, rank + 1, position,
                                     std::string_view(e.what()).substr(std::string_view("[pipeline] ").size())));
      }
      highest_stage = std::max(highest_stage, list.back().stage);
      highest_microbatch = std::max(highest_microbatch, list.back().microbatch);
    }
  }
  schedule.stages = stages.value_or(highest_stage + 1);
  schedule.microbatches = microbatches.value_or(highest_microbatch + 1);
  // A stage belongs to the rank that computes it (communication actions name
  // the sending or receiving stage, which may be a peer's).
  schedule.stages_of_rank.resize(schedule.actions.size());
  for (std::size_t rank = 0; rank < schedule.actions.size(); ++rank)
    for (const Action& a : schedule.actions[rank]) {
      if (!is_compute(a.kind)) continue;
      auto& held = schedule.stages_of_rank[rank];
      if (std::ranges::find(held, a.stage) == held.end()) held.push_back(a.stage);
    }
  for (auto& held : schedule.stages_of_rank) std::ranges::sort(held);
  return schedule;
}

std::string grid_text(const Schedule& schedule, std::optional<std::pair<int, int>> marked) {
  std::size_t width = 6;
  std::size_t steps = 0;
  for (const auto& list : schedule.actions) {
    steps = std::max(steps, list.size());
    for (const Action& a : list) width = std::max(width, action_text(a).size() + 2);
  }
  std::string text = fmt::format("{:<6}", "step");
  for (int rank = 0; rank < schedule.ranks(); ++rank)
    text += fmt::format(" {:<{}}", fmt::format("rank {}", rank), width);
  while (text.back() == ' ') text.pop_back();
  text += '\n';
  for (std::size_t step = 0; step < steps; ++step) {
    text += fmt::format("{:<6}", step);
    for (int rank = 0; rank < schedule.ranks(); ++rank) {
      const auto& list = schedule.actions[rank];
      std::string cell = step < list.size() ? action_text(list[step]) : "";
      if (marked && marked->first == rank && marked->second == static_cast<int>(step)) cell = "[" + cell + "]";
      text += fmt::format(" {:<{}}", cell, width);
    }
    while (!text.empty() && text.back() == ' ') text.pop_back();
    text += '\n';
  }
  return text;
}

}  // namespace dtensor::nn::pipeline
