// An op's decision: one row per input (as called, then as the strategy
// takes it), then the output, under a caption with the runner-up's cost.
#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "draw.h"
#include "dtensor/core/units.h"

namespace dtensor::pictures {
namespace {

constexpr double kMargin = 12;
constexpr double kArrowWidth = 230;

std::string layouts_text(std::span<const Layout> layouts) {
  std::vector<std::string> parts;
  for (const Layout& l : layouts) parts.push_back(fmt::format("{}", l));
  return fmt::format("[{}]", fmt::join(parts, "] ["));
}

/// "all_gather over tp, 1 KiB" for each communicating step of a plan.
std::string plan_summary(const Plan& plan, const PictureOptions& options) {
  std::vector<std::string> steps;
  for (const PlanStep& step : plan.steps)
    steps.push_back(detail::step_label(step, options) +
                    (is_local(step.kind) ? "" : ", " + human_bytes(step.max_recv_bytes())));
  return fmt::format("{}", fmt::join(steps, "; "));
}

std::string horizontal_arrow(double x, double y, const std::string& label) {
  return fmt::format(R"(<g class="move"><line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="#444" )"
                     R"(stroke-width="2"/><polygon points="{:.1f},{:.1f} {:.1f},{:.1f} {:.1f},{:.1f}" fill="#444"/>)"
                     R"(<text x="{:.1f}" y="{:.1f}" font-size="11">{}</text></g>)",
                     x + 8, y, x + kArrowWidth - 14, y, x + kArrowWidth - 16, y - 6, x + kArrowWidth - 16, y + 6,
                     x + kArrowWidth - 6, y, x + 8, y - 8, xml_escape(label));
}

}  // namespace

std::string decision_svg(const ExplainedOp& e, const PictureOptions& options) {
  const OpDecision& d = e.decision;
  detail::Drawing all;
  std::vector<std::string> head{
      fmt::format("{}{}: chose {} -> {} at {}", e.tag.empty() ? std::string() : fmt::format("[{}] ", e.tag),
                  e.op.name, layouts_text(d.chosen.inputs), d.chosen.output, human_seconds(d.cost_seconds))};
  if (d.runner_up_cost >= 0)
    head.push_back(fmt::format("runner-up {} -> {} at {}; {} candidates", layouts_text(d.runner_up.inputs),
                               d.runner_up.output, human_seconds(d.runner_up_cost), d.candidates));
  if (!d.chosen.note.empty()) head.push_back(d.chosen.note);
  double y = kMargin;
  for (std::size_t i = 0; i < head.size(); ++i) {
    all.body += fmt::format(R"(<text class="{}" x="{}" y="{:.1f}" font-size="{}"{}>{}</text>)",
                            i == 0 ? "title" : "caption", kMargin, y + 12, i == 0 ? 14 : 11,
                            i == 0 ? R"( font-weight="bold")" : "", xml_escape(head[i]));
    y += i == 0 ? 20 : 15;
    all.width = std::max(all.width, static_cast<double>(head[i].size()) * (i == 0 ? 9.0 : 6.2) + 2 * kMargin);
  }
  auto place = [&](double x, double top, const Shape& shape, const Layout& layout, const std::string& title) {
    PictureOptions panel = options;
    panel.title = title;
    const detail::Drawing d = detail::draw_layout(e.mesh_shape, shape, layout, panel);
    all.body += fmt::format(R"~(<g class="decision-panel" transform="translate({:.1f},{:.1f})">)~", x, top) + d.body +
                "</g>";
    all.width = std::max(all.width, x + d.width);
    return d;
  };
  for (std::size_t i = 0; i < e.inputs.size(); ++i) {
    const detail::Drawing before =
        place(0, y, e.inputs[i].shape, e.layouts[i], fmt::format("input {} as called: {}", i, e.layouts[i]));
    double row = before.height;
    if (const Plan* plan = d.input_plans[i]) {
      all.body += horizontal_arrow(before.width, y + 60, plan_summary(*plan, options));
      const detail::Drawing after = place(before.width + kArrowWidth, y, e.inputs[i].shape, d.chosen.inputs[i],
                                          fmt::format("as {} takes it: {}", e.op.name, d.chosen.inputs[i]));
      row = std::max(row, after.height);
    } else {
      all.body += fmt::format(R"(<text class="stays" x="{:.1f}" y="{:.1f}" font-size="11">stays as it is</text>)",
                              before.width + 8, y + 60);
      all.width = std::max(all.width, before.width + 120);
    }
    y += row;
  }
  y += place(0, y, d.output.shape, d.chosen.output, fmt::format("output: {}", d.chosen.output)).height;
  all.height = y + kMargin;
  return detail::svg_document(all);
}

ExplainPictures::ExplainPictures(PictureOptions options, std::function<void(const std::string&)> sink)
    : options_(std::move(options)),
      scope_(sink ? std::move(sink) : [](const std::string&) {},
             [this](const ExplainedOp& op) { svgs_.push_back(decision_svg(op, options_)); }) {}

}  // namespace dtensor::pictures
