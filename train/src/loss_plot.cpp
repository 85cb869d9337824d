#include "dtensor/train/loss_plot.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include <fmt/format.h>

#include <dtensor/core/error.h>
#include <dtensor/pictures/svg.h>

namespace dtensor::train {
namespace {

// The page: 800 x 500 pixels, the plot area inside these margins (the top
// one grows with the title's lines).
constexpr double kWidth = 800, kHeight = 500;
constexpr double kLeft = 80, kRight = 30, kBottom = 60, kTopBelowTitle = 20;
constexpr int kTargetTicks = 6;
// A title longer than this is wrapped at spaces in the smaller font; at
// 12 px sans-serif a character is about 6.5 px wide, so 100 fill the page.
constexpr std::size_t kOneLineTitle = 70;
constexpr std::size_t kWrappedLineChars = 100;
constexpr std::size_t kMaxTitleLines = 4;
constexpr const char* kTrainColour = "#1f77b4";
constexpr const char* kValColour = "#d62728";

struct Point {
  double x, y;
};

// A series' finite points, and how many of the given ones were not finite.
struct Series {
  std::vector<Point> points;
  std::size_t skipped = 0;
};

// An axis from lo to hi in ticks `step` apart, lo and hi multiples of step.
struct Axis {
  double lo, hi, step;
};

// 1, 2, 5 or 10 times a power of ten, near x (Heckbert, "Nice numbers for
// graph labels", Graphics Gems, 1990): rounded when picking the tick step,
// else the smallest such number at least x.
double nice_number(double x, bool round) {
  const double power = std::pow(10.0, std::floor(std::log10(x)));
  const double fraction = x / power;
  double nice;
  if (round)
    nice = fraction < 1.5 ? 1 : fraction < 3 ? 2 : fraction < 7 ? 5 : 10;
  else
    nice = fraction <= 1 ? 1 : fraction <= 2 ? 2 : fraction <= 5 ? 5 : 10;
  return nice * power;
}

// An axis covering [lo, hi] with round ticks. A single value gets a band
// around it (10% of it, or 1 at zero) so it sits mid-plot, not on an edge;
// the band stops at zero for values that cannot be negative (steps).
Axis nice_axis(double lo, double hi, bool steps) {
  if (!(hi > lo)) {
    const double pad = lo == 0 ? 1 : std::abs(lo) * 0.1;
    lo = steps && lo >= 0 ? std::max(0.0, lo - pad) : lo - pad;
    hi += pad;
  }
  double step = nice_number(nice_number(hi - lo, false) / (kTargetTicks - 1), true);
  if (steps) step = std::max(step, 1.0);  // steps are whole numbers
  return {std::floor(lo / step) * step, std::ceil(hi / step) * step, step};
}

std::vector<double> ticks(const Axis& axis) {
  std::vector<double> out;
  // Counted, not accumulated, so that 0.1-steps do not drift; the slack
  // admits hi itself.
  for (int i = 0;; ++i) {
    const double v = axis.lo + i * axis.step;
    if (v > axis.hi + axis.step * 1e-9) break;
    out.push_back(std::abs(v) < axis.step * 1e-9 ? 0.0 : v);  // no "-0.0"
  }
  return out;
}

// As many decimals as the tick step needs: 0.2 -> 1, 0.05 -> 2, 5 -> 0.
std::string tick_label(double v, double step) {
  const int decimals = std::max(0, -static_cast<int>(std::floor(std::log10(step) + 1e-9)));
  return fmt::format("{:.{}f}", v, decimals);
}

using dtensor::pictures::xml_escape;

// Words onto lines of at most `width` characters (a longer word gets its own
// line); past max_lines the last line ends in "...".
std::vector<std::string> wrap(const std::string& text, std::size_t width, std::size_t max_lines) {
  std::vector<std::string> lines(1);
  std::size_t pos = 0;
  while (pos < text.size()) {
    const std::size_t space = text.find(' ', pos);
    const std::string word = text.substr(pos, space == std::string::npos ? std::string::npos : space - pos);
    pos = space == std::string::npos ? text.size() : space + 1;
    if (word.empty()) continue;
    if (!lines.back().empty() && lines.back().size() + 1 + word.size() > width) lines.emplace_back();
    lines.back() += (lines.back().empty() ? "" : " ") + word;
  }
  if (lines.size() > max_lines) {
    lines.resize(max_lines);
    lines.back() += " ...";
  }
  return lines;
}

Series train_series(const std::vector<double>& losses) {
  Series s;
  for (std::size_t i = 0; i < losses.size(); ++i) {
    if (std::isfinite(losses[i]))
      s.points.push_back({static_cast<double>(i), losses[i]});
    else
      ++s.skipped;
  }
  return s;
}

Series val_series(const std::vector<std::pair<std::int64_t, double>>& points) {
  Series s;
  for (const auto& [step, loss] : points) {
    if (std::isfinite(loss))
      s.points.push_back({static_cast<double>(step), loss});
    else
      ++s.skipped;
  }
  return s;
}

std::string legend_label(const char* name, const Series& s, const char* unit) {
  std::string label = fmt::format("{} ({} {}{})", name, s.points.size(), unit, s.points.size() == 1 ? "" : "s");
  if (s.skipped) label += fmt::format(", {} NaN/inf skipped", s.skipped);
  return label;
}

// The legend's box, top right inside a plot whose right edge is at x =
// `right` and top at y = `top`: a line in each entry's colour, its label.
std::string legend(const std::vector<std::pair<std::string, const char*>>& entries, double right, double top) {
  std::size_t longest = 0;
  for (const auto& e : entries) longest = std::max(longest, e.first.size());
  const double box_w = 40 + 6.5 * static_cast<double>(longest), box_h = 8 + 20 * static_cast<double>(entries.size());
  const double bx = right - box_w - 10, by = top + 10;
  std::string svg = fmt::format(
      "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"white\" fill-opacity=\"0.9\" "
      "stroke=\"#999\"/>\n",
      bx, by, box_w, box_h);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const double y = by + 18 + 20 * static_cast<double>(i);
    svg +=
        fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" stroke-width=\"2\"/>",
                    bx + 8, y - 4, bx + 30, y - 4, entries[i].second);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\">{}</text>\n", bx + 36, y,
                       xml_escape(entries[i].first));
  }
  return svg;
}

}  // namespace

std::string loss_svg(const std::string& title, const std::vector<double>& train_losses,
                     const std::vector<std::pair<std::int64_t, double>>& val_points) {
  const Series train = train_series(train_losses);
  const Series val = val_series(val_points);

  // The axes cover every finite point of both series; with none, 0..1.
  double x_lo = 0, x_hi = 1, y_lo = 0, y_hi = 1;
  bool any = false;
  for (const Series* s : {&train, &val}) {
    for (const Point& p : s->points) {
      x_lo = any ? std::min(x_lo, p.x) : p.x;
      x_hi = any ? std::max(x_hi, p.x) : p.x;
      y_lo = any ? std::min(y_lo, p.y) : p.y;
      y_hi = any ? std::max(y_hi, p.y) : p.y;
      any = true;
    }
  }
  const Axis xa = nice_axis(x_lo, x_hi, true);
  const Axis ya = nice_axis(y_lo, y_hi, false);

  const bool short_title = title.size() <= kOneLineTitle;
  const double title_px = short_title ? 16 : 12;
  const std::vector<std::string> title_lines =
      short_title ? std::vector<std::string>{title} : wrap(title, kWrappedLineChars, kMaxTitleLines);
  const double top = 10 + title_px * 1.3 * static_cast<double>(title_lines.size()) + kTopBelowTitle;
  const double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - top - kBottom;
  auto px = [&](double x) { return kLeft + (x - xa.lo) / (xa.hi - xa.lo) * plot_w; };
  auto py = [&](double y) { return top + (ya.hi - y) / (ya.hi - ya.lo) * plot_h; };

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      kWidth, kHeight);

  svg += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"{}\" text-anchor=\"middle\">", kWidth / 2, 10 + title_px,
                     title_px);
  for (std::size_t i = 0; i < title_lines.size(); ++i)
    svg += fmt::format("<tspan x=\"{}\" dy=\"{}\">{}</tspan>", kWidth / 2, i == 0 ? 0 : title_px * 1.3,
                       xml_escape(title_lines[i]));
  svg += "</text>\n";

  // Grid lines and tick labels, then the frame over them.
  svg += "<g font-size=\"12\" fill=\"#333\">\n";
  for (double v : ticks(ya)) {
    svg += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>", kLeft, py(v),
                       kLeft + plot_w, py(v));
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", kLeft - 8, py(v) + 4,
                       tick_label(v, ya.step));
  }
  for (double v : ticks(xa)) {
    svg += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>", px(v), top,
                       px(v), top + plot_h);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", px(v), top + plot_h + 18,
                       tick_label(v, xa.step));
  }
  svg += "</g>\n";
  svg += fmt::format("<rect x=\"{}\" y=\"{:.1f}\" width=\"{}\" height=\"{:.1f}\" fill=\"none\" stroke=\"#333\"/>\n",
                     kLeft, top, plot_w, plot_h);
  svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"14\" text-anchor=\"middle\">step</text>\n",
                     kLeft + plot_w / 2, kHeight - 18);
  svg += fmt::format(
      "<text transform=\"translate(22 {:.1f}) rotate(-90)\" font-size=\"14\" text-anchor=\"middle\">"
      "loss (nats per byte)</text>\n",
      top + plot_h / 2);

  // The curves: one polyline per series with points; markers where a line
  // alone would not show (a single training point; the validation points).
  auto polyline = [&](const Series& s, const char* colour, double stroke_width) {
    std::string out =
        fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"{}\" points=\"", colour, stroke_width);
    for (const Point& p : s.points) out += fmt::format("{:.1f},{:.1f} ", px(p.x), py(p.y));
    return out + "\"/>\n";
  };
  auto markers = [&](const Series& s, const char* colour) {
    std::string out;
    for (const Point& p : s.points)
      out += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"{}\"/>\n", px(p.x), py(p.y), colour);
    return out;
  };
  if (!train.points.empty()) svg += polyline(train, kTrainColour, 1.5);
  if (train.points.size() == 1) svg += markers(train, kTrainColour);
  if (!val.points.empty()) svg += polyline(val, kValColour, 2) + markers(val, kValColour);

  // The legend, top right inside the plot, on a white box over the curves.
  std::vector<std::pair<std::string, const char*>> entries;
  if (!train_losses.empty()) entries.emplace_back(legend_label("train", train, "step"), kTrainColour);
  if (!val_points.empty()) entries.emplace_back(legend_label("validation", val, "point"), kValColour);
  if (!entries.empty()) svg += legend(entries, kLeft + plot_w, top);
  return svg + "</svg>\n";
}

void write_loss_svg(const std::string& path, const std::string& title, const std::vector<double>& train_losses,
                    const std::vector<std::pair<std::int64_t, double>>& val_points) {
  const std::string svg = loss_svg(title, train_losses, val_points);
  std::ofstream out(path, std::ios::binary);
  if (!out) throw dtensor::ValueError("[loss_plot] cannot open '" + path + "' for writing");
  out << svg;
  out.close();
  if (!out) throw dtensor::ValueError("[loss_plot] error writing '" + path + "'");
}

}  // namespace dtensor::train
