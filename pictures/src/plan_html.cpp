// The plan page: the plan picture inline, the steps with the planner's
// reasons, and a hover panel. Self-contained: it must open from a file
// on a machine without a network.
#include <fmt/format.h>

#include "draw.h"
#include "dtensor/core/units.h"

namespace dtensor::pictures {
namespace {

// The hover: a tile's <title> holds everything a person asks of it (ranks
// and coordinates, offset and size, bytes); the panel shows it while the
// pointer is over the tile, and the tile is outlined.
constexpr const char* kScript = R"js(
document.querySelectorAll('g.tile').forEach(function (tile) {
  var info = document.getElementById('hover');
  tile.addEventListener('mouseenter', function () {
    var title = tile.querySelector('title');
    info.textContent = title ? title.textContent : '';
    tile.classList.add('hovered');
  });
  tile.addEventListener('mouseleave', function () {
    info.textContent = 'Point at a tile to see who holds it.';
    tile.classList.remove('hovered');
  });
});
)js";

constexpr const char* kStyle = R"css(
body { font-family: DejaVu Sans, Helvetica, Arial, sans-serif; margin: 16px; color: #222; }
main { display: flex; gap: 24px; align-items: flex-start; }
aside { position: sticky; top: 16px; min-width: 280px; max-width: 360px; }
#hover { white-space: pre-wrap; background: #f6f6f6; border: 1px solid #ccc; padding: 8px; min-height: 4em; }
g.tile.hovered rect.box { stroke: #d00; stroke-width: 3; }
ol li { margin-bottom: 6px; }
)css";

std::string steps_list(const Plan& plan, const PictureOptions& options) {
  if (plan.steps.empty()) return "<p>Nothing to do: the layouts are the same.</p>";
  std::string out = "<ol class=\"steps\">";
  for (const PlanStep& step : plan.steps) {
    out += fmt::format("<li><b>{}</b> over {}: {} &rarr; {}; the busiest rank receives {}, estimated {}.<br>{}</li>",
                       step_name(step.kind), xml_escape(detail::mesh_dims_label(step.mesh_dims, options)),
                       xml_escape(fmt::format("{}", step.from)), xml_escape(fmt::format("{}", step.to)),
                       human_bytes(step.max_recv_bytes()), human_seconds(step.est_seconds),
                       xml_escape(step.reason));
  }
  return out + "</ol>";
}

}  // namespace

std::string plan_html(const Plan& plan, const PictureOptions& options) {
  const std::string title = fmt::format("{} -> {} on a {} mesh", plan.from, plan.to, fmt::join(plan.mesh_shape, "x"));
  std::string svg = plan_svg(plan, options);
  return fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{0}</title><style>{1}</style></head>"
      "<body><h1>{0}</h1><p>A {2} tensor of {3}: the busiest rank receives {4} in {5} step(s), estimated {6}.{10}</p>"
      "<main><div class=\"picture\">{7}</div><aside><h2>Hover</h2><div id=\"hover\">Point at a tile to see who "
      "holds it.</div><h2>Steps</h2>{8}</aside></main><script>{9}</script></body></html>\n",
      xml_escape(title), kStyle, fmt::join(plan.global_shape, "x"), plan.dtype, human_bytes(plan.max_recv_bytes()),
      plan.steps.size(), human_seconds(plan.est_seconds), svg, steps_list(plan, options), kScript,
      plan.runner_up ? " The " + xml_escape(runner_up_text(plan)) + "." : std::string());
}

}  // namespace dtensor::pictures
