// A plan picture: the source layout, then the layout after each step, top
// to bottom, joined by arrows that say what each step sends.
#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "draw.h"
#include "dtensor/core/units.h"

namespace dtensor::pictures {

std::string detail::step_label(const PlanStep& step, const PictureOptions& options) {
  if (step.mesh_dims.empty()) return std::string(step_name(step.kind));
  return fmt::format("{} over {}", step_name(step.kind), mesh_dims_label(step.mesh_dims, options));
}

namespace {

constexpr double kArrowHeight = 54;
constexpr double kMargin = 12;

std::string step_text(const PlanStep& step, const PictureOptions& options) {
  if (is_local(step.kind)) return fmt::format("{}: local, nothing sent", detail::step_label(step, options));
  return fmt::format("{}: {} to the busiest rank", detail::step_label(step, options),
                     human_bytes(step.max_recv_bytes()));
}

/// The arrow into a step's panel: what it sends, and under it, smaller,
/// why the planner chose it (its reason names the runner-up plan).
std::string arrow(double x, double y, const std::string& label, const std::string& reason, int step) {
  return fmt::format(R"(<g class="step" data-step="{}">)"
                     R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="#444" stroke-width="2"/>)"
                     R"(<polygon points="{:.1f},{:.1f} {:.1f},{:.1f} {:.1f},{:.1f}" fill="#444"/>)"
                     R"(<text x="{:.1f}" y="{:.1f}" font-size="12">{}</text>)"
                     R"(<text class="reason" x="{:.1f}" y="{:.1f}" font-size="10" fill="#555">{}</text></g>)",
                     step, x, y + 4, x, y + kArrowHeight - 10, x - 6, y + kArrowHeight - 12, x + 6,
                     y + kArrowHeight - 12, x, y + kArrowHeight - 2, x + 14, y + kArrowHeight / 2 - 2,
                     xml_escape(fmt::format("step {}: {}", step, label)), x + 14, y + kArrowHeight / 2 + 12,
                     xml_escape(reason));
}

}  // namespace

std::string runner_up_text(const Plan& plan) {
  if (!plan.runner_up) return {};
  const PlanRunnerUp& r = *plan.runner_up;
  return fmt::format("runner-up: {}, {} to the busiest rank, estimated {}", fmt::join(r.kinds, "+"),
                     human_bytes(r.bytes), human_seconds(r.est_seconds));
}

std::string plan_svg(const Plan& plan, const PictureOptions& options) {
  detail::Drawing all;
  const std::string summary =
      plan.steps.empty()
          ? std::string("nothing to do: the layouts are the same")
          : fmt::format("{} step(s), {} collective(s); the busiest rank receives {}; estimated {}", plan.steps.size(),
                        plan.num_collectives(), human_bytes(plan.max_recv_bytes()), human_seconds(plan.est_seconds));
  const std::string title = fmt::format("{} -> {} on a {} mesh", plan.from, plan.to, fmt::join(plan.mesh_shape, "x"));
  all.body += fmt::format(R"(<text class="title" x="{}" y="{}" font-size="15" font-weight="bold">{}</text>)",
                          kMargin, kMargin + 12, xml_escape(title));
  all.width = static_cast<double>(title.size()) * 9.5 + 2 * kMargin;  // 15 px bold
  all.body += fmt::format(R"(<text class="caption" x="{}" y="{}" font-size="12">{}</text>)", kMargin, kMargin + 30,
                          xml_escape(summary));
  double y = kMargin + 40;
  const std::string runner_up = runner_up_text(plan);
  if (!runner_up.empty()) {
    all.body += fmt::format(R"(<text class="runner-up" x="{}" y="{}" font-size="12" fill="#555">{}</text>)", kMargin,
                            kMargin + 46, xml_escape(runner_up));
    all.width = std::max(all.width, static_cast<double>(runner_up.size()) * 7 + 2 * kMargin);
    y += 16;
  }
  auto place = [&](const Layout& layout, const std::string& title) {
    PictureOptions panel = options;
    panel.title = title;
    const detail::Drawing d = detail::draw_layout(plan.mesh_shape, plan.global_shape, layout, panel);
    all.body += fmt::format(R"~(<g class="plan-panel" transform="translate(0,{:.1f})">)~", y) + d.body + "</g>";
    all.width = std::max(all.width, d.width);
    y += d.height;
  };
  place(plan.from, fmt::format("before: {}", plan.from));
  for (std::size_t i = 0; i < plan.steps.size(); ++i) {
    const PlanStep& step = plan.steps[i];
    const std::string label = step_text(step, options);
    all.body += arrow(kMargin + 40, y, label, step.reason, static_cast<int>(i + 1));
    all.width = std::max({all.width, kMargin + 60 + static_cast<double>(label.size()) * 7.2,
                          kMargin + 60 + static_cast<double>(step.reason.size()) * 6});
    y += kArrowHeight;
    place(step.to, fmt::format("after step {}: {}", i + 1, step.to));
  }
  all.width = std::max(all.width, static_cast<double>(summary.size()) * 7 + 2 * kMargin);
  all.height = y + kMargin;
  return detail::svg_document(all);
}

}  // namespace dtensor::pictures
