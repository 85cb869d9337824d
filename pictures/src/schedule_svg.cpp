// A schedule picture: one row per rank, each box coloured by what it runs,
// the idle time between boxes hatched so that a pipeline's bubble is what
// the eye sees first.
#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "dtensor/core/error.h"
#include "draw.h"

namespace dtensor::pictures {

namespace {

constexpr double kMargin = 12;
constexpr double kRowHeight = 22;
constexpr double kRowGap = 8;
constexpr double kCharWidth = 6.2;  // an 11px sans-serif character, roughly

struct KindStyle {
  const char* fill;
  const char* name;  // in the legend
};

// Forward blue, the backward halves two greens, a full backward darker:
// the four kinds of a pipeline schedule, told apart at a glance.
KindStyle style_of(std::string_view kind) {
  static const std::map<std::string_view, KindStyle> styles{
      {"forward", {"#6fa8dc", "forward (F)"}},
      {"backward", {"#38761d", "backward (B)"}},
      {"input_backward", {"#93c47d", "input gradient (I)"}},
      {"weight_backward", {"#b6d7a8", "weight gradient (W)"}},
  };
  const auto it = styles.find(kind);
  return it == styles.end() ? KindStyle{"#cccccc", nullptr} : it->second;
}

void check_boxes(std::span<const ScheduleRow> rows) {
  bool any = false;
  for (const ScheduleRow& row : rows)
    for (const ScheduleBox& box : row.boxes) {
      if (!std::isfinite(box.start) || !std::isfinite(box.end) || box.end < box.start)
        throw ValueError(
            fmt::format("[pictures] schedule_svg: box '{}' of row '{}' runs from {} to {}; expected finite times with "
                        "the end "
                        "not before the start",
                        box.label, row.name, box.start, box.end));
      any = true;
    }
  if (!any) throw ValueError("[pictures] schedule_svg: no boxes to draw; expected at least one row with a box");
}

std::string draw_box(const ScheduleBox& box, double x, double w, double y) {
  const KindStyle style = style_of(box.kind);
  const bool labelled = w >= static_cast<double>(box.label.size()) * kCharWidth * 0.85 + 2;
  return fmt::
      format(R"(<g class="box" data-kind="{}"><rect x="{:.2f}" y="{:.1f}" width="{:.2f}" height="{}" fill="{}" )"
             R"(stroke="#333" stroke-width="0.5"/>{}<title>{}</title></g>)",
             xml_escape(box.kind), x, y, w, kRowHeight, style.fill,
             labelled ? fmt::format(R"(<text x="{:.2f}" y="{:.1f}" font-size="10" text-anchor="middle">{}</text>)",
                                    x + w / 2, y + kRowHeight / 2 + 3.5, xml_escape(box.label))
                      : std::string(),
             xml_escape(box.tooltip.empty() ? box.label : box.tooltip));
}

// The row's idle share: the time between 0 and the schedule's end that no
// box covers (boxes may touch or overlap).
double idle_time(const ScheduleRow& row, double end) {
  std::vector<std::pair<double, double>> spans;
  for (const ScheduleBox& b : row.boxes) spans.emplace_back(b.start, b.end);
  std::sort(spans.begin(), spans.end());
  double covered = 0, reach = 0;
  for (const auto& [s, e] : spans) {
    const double from = std::max(s, reach);
    if (e > from) covered += e - from;
    reach = std::max(reach, e);
  }
  return std::max(0.0, end - covered);
}

}  // namespace

std::string schedule_svg(std::span<const ScheduleRow> rows, const SchedulePictureOptions& options) {
  if (!(options.width > 0) || !std::isfinite(options.width))
    throw ValueError(fmt::format("[pictures] schedule_svg: width {} px; expected a positive number", options.width));
  check_boxes(rows);
  double end = 0;
  std::size_t longest_name = 0;
  std::map<std::string, KindStyle> kinds;
  for (const ScheduleRow& row : rows) {
    longest_name = std::max(longest_name, row.name.size());
    for (const ScheduleBox& b : row.boxes) {
      end = std::max(end, b.end);
      kinds.emplace(b.kind, style_of(b.kind));
    }
  }
  const double span = std::max(end, 1e-12);
  const double left = kMargin + static_cast<double>(longest_name) * kCharWidth + 10;
  const double scale = options.width / span;
  auto x_of = [&](double t) { return left + t * scale; };

  detail::Drawing d;
  double y = kMargin + 12;
  if (!options.title.empty()) {
    d.body += fmt::format(R"(<text class="title" x="{}" y="{}" font-size="15" font-weight="bold">{}</text>)", kMargin,
                          y, xml_escape(options.title));
    y += 18;
  }
  if (!options.subtitle.empty()) {
    d.body += fmt::format(R"(<text class="subtitle" x="{}" y="{}" font-size="11" fill="#555">{}</text>)", kMargin, y,
                          xml_escape(options.subtitle));
    y += 14;
  }
  y += 4;
  d.body += R"(<defs><pattern id="idle" width="6" height="6" patternUnits="userSpaceOnUse" )"
            R"svg(patternTransform="rotate(45)"><rect width="6" height="6" fill="#fafafa"/>)svg"
            R"(<line x1="0" y1="0" x2="0" y2="6" stroke="#d0d0d0" stroke-width="2"/></pattern></defs>)";
  for (const ScheduleRow& row : rows) {
    d.body += fmt::format(R"(<g class="row"><text class="name" x="{}" y="{:.1f}" font-size="11">{}</text>)", kMargin,
                          y + kRowHeight / 2 + 4, xml_escape(row.name));
    // The whole row hatched, the boxes over it: what stays hatched is idle.
    d.body +=
        fmt::format(R"svg(<rect class="idle" x="{:.2f}" y="{:.1f}" width="{:.2f}" height="{}" fill="url(#idle)" )svg"
                    R"(stroke="#bbb" stroke-width="0.5"/>)",
                    left, y, options.width, kRowHeight);
    for (const ScheduleBox& b : row.boxes) d.body += draw_box(b, x_of(b.start), (b.end - b.start) * scale, y);
    const double idle = idle_time(row, end);
    d.body += fmt::format(R"(<text class="idle-share" x="{:.1f}" y="{:.1f}" font-size="10" fill="#555">)"
                          R"(idle {:.0f}%</text></g>)",
                          left + options.width + 6, y + kRowHeight / 2 + 4, 100 * idle / span);
    y += kRowHeight + kRowGap;
  }
  // The legend: each kind drawn, and the hatch for idle time.
  double lx = kMargin;
  y += 4;
  auto legend = [&](const std::string& fill, const std::string& text) {
    d.body +=
        fmt::format(R"(<g class="legend"><rect x="{:.1f}" y="{:.1f}" width="12" height="12" fill="{}" stroke="#333" )"
                    R"(stroke-width="0.5"/><text x="{:.1f}" y="{:.1f}" font-size="11">{}</text></g>)",
                    lx, y, fill, lx + 16, y + 10, xml_escape(text));
    lx += 16 + static_cast<double>(text.size()) * kCharWidth + 14;
  };
  for (const auto& [kind, style] : kinds) legend(style.fill, style.name ? style.name : kind);
  legend("url(#idle)", "idle (the bubble)");
  d.width = std::max({left + options.width + 60 + kMargin, lx + kMargin,
                      static_cast<double>(options.title.size()) * 9.5 + 2 * kMargin,
                      static_cast<double>(options.subtitle.size()) * kCharWidth + 2 * kMargin});
  d.height = y + 12 + kMargin;
  return detail::svg_document(d);
}

}  // namespace dtensor::pictures
