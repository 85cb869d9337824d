// The layout picture: the boxes local_box gives each rank, grouped where
// ranks hold the same box, drawn on a grid of two tensor dims with the
// other dims as small multiples.
#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "draw.h"
#include "dtensor/core/error.h"
#include "dtensor/core/units.h"

namespace dtensor::pictures {
namespace detail {
namespace {

constexpr double kGridSide = 260;    // px the longer grid dim spans
constexpr double kMinGridSide = 44;  // px the shorter spans at least
constexpr double kPanelGap = 30;
constexpr double kPanelHeader = 18;
constexpr double kLine = 15;  // px per caption line
constexpr double kMargin = 12;
constexpr int kPanelsPerRow = 4;
constexpr std::size_t kMaxPanels = 64;
constexpr int kMaxShadows = 2;  // copies drawn behind a tile

using Range = std::pair<std::int64_t, std::int64_t>;  // [lo, hi)

/// Ranks holding one box, ascending.
struct Tile {
  Box box;
  std::vector<int> ranks;
};

/// What the picture is drawn from: every rank's coordinate and box, the
/// dims drawn as the grid, and the stretches of the other dims (one panel
/// per combination).
struct Geometry {
  Shape mesh_shape;
  Shape global_shape;
  Layout layout;
  int row_dim = -1;  // -1: one row
  int col_dim = -1;  // -1: one column
  std::vector<int> other_dims;
  std::vector<std::vector<Range>> panels;  // per panel, a range per other dim
  std::vector<Shape> coords;               // per rank
  std::vector<Box> boxes;                  // per rank
};

std::pair<int, int> grid_dims(int ndim, const PictureOptions& options) {
  auto check = [&](int dim, const char* which) {
    if (dim < -1 || dim >= ndim)
      throw ValueError(fmt::format("picture {} dim {} is out of range for a {}-D tensor (expected -1 or 0..{})",
                                   which, dim, ndim, ndim - 1));
  };
  check(options.row_dim, "row");
  check(options.col_dim, "column");
  if (options.row_dim >= 0 && options.row_dim == options.col_dim)
    throw ValueError(fmt::format("picture row and column dims are both {}: expected two different tensor dims",
                                 options.row_dim));
  if (ndim == 0) return {-1, -1};
  if (ndim == 1) return options.row_dim == 0 ? std::pair{0, -1} : std::pair{-1, 0};
  // The last dim not taken by the other choice.
  auto last_but = [&](int taken) { return taken == ndim - 1 ? ndim - 2 : ndim - 1; };
  int col = options.col_dim >= 0 ? options.col_dim : last_but(options.row_dim);
  int row = options.row_dim >= 0 ? options.row_dim : last_but(col);
  return {row, col};
}

/// The stretches of tensor dim `dim` that no box boundary crosses.
std::vector<Range> stretches(int dim, std::int64_t extent, const std::vector<Box>& boxes) {
  std::set<std::int64_t> cuts{0, extent};
  for (const Box& b : boxes)
    if (!b.empty()) cuts.insert({b.offset[dim], b.offset[dim] + b.size[dim]});
  std::vector<Range> out;
  for (auto it = cuts.begin(); std::next(it) != cuts.end(); ++it) out.emplace_back(*it, *std::next(it));
  if (out.empty()) out.emplace_back(0, 0);
  return out;
}

Geometry geometry(const Shape& mesh_shape, const Shape& global_shape, const Layout& layout,
                  const PictureOptions& options) {
  Geometry g;
  g.mesh_shape = mesh_shape;
  g.global_shape = global_shape;
  g.layout = validate_layout(layout, mesh_shape, global_shape);
  const int ndim = static_cast<int>(global_shape.size());
  std::tie(g.row_dim, g.col_dim) = grid_dims(ndim, options);
  for (int d = 0; d < ndim; ++d)
    if (d != g.row_dim && d != g.col_dim) g.other_dims.push_back(d);
  const std::int64_t ranks = numel(mesh_shape);
  for (std::int64_t r = 0; r < ranks; ++r) {
    g.coords.push_back(unravel_index(r, mesh_shape));
    g.boxes.push_back(local_box(mesh_shape, global_shape, g.layout, g.coords.back()));
  }
  g.panels = {{}};
  for (int d : g.other_dims) {
    std::vector<std::vector<Range>> next;
    for (const auto& panel : g.panels)
      for (const Range& s : stretches(d, global_shape[d], g.boxes)) {
        next.push_back(panel);
        next.back().push_back(s);
      }
    g.panels = std::move(next);
    if (g.panels.size() > kMaxPanels)
      throw ValueError(fmt::format("a picture of {} under {} needs more than {} panels: choose the drawn dims "
                                   "(row_dim, col_dim) so that the dims sharded most are on the grid",
                                   fmt::join(global_shape, "x"), g.layout, kMaxPanels));
  }
  return g;
}

bool covers(const Geometry& g, const Box& box, const std::vector<Range>& panel) {
  if (box.empty()) return false;
  for (std::size_t i = 0; i < g.other_dims.size(); ++i) {
    const int d = g.other_dims[i];
    if (box.offset[d] > panel[i].first || box.offset[d] + box.size[d] < panel[i].second) return false;
  }
  return true;
}

std::vector<Tile> tiles_of(const Geometry& g, const std::vector<Range>& panel) {
  std::map<std::pair<Shape, Shape>, std::vector<int>> by_box;
  std::vector<Tile> tiles;
  for (std::size_t r = 0; r < g.boxes.size(); ++r) {
    const Box& b = g.boxes[r];
    if (!covers(g, b, panel)) continue;
    auto [it, fresh] = by_box.try_emplace({b.offset, b.size});
    if (fresh) tiles.push_back(Tile{b, {}});
    it->second.push_back(static_cast<int>(r));
  }
  for (Tile& t : tiles) t.ranks = by_box.at({t.box.offset, t.box.size});
  return tiles;
}

/// Every rank keeps one colour in every picture of a mesh (a plan's panels
/// included): hue along the first mesh dim of more than one rank, lightness
/// along the second. A tile takes its lowest holder's colour; the copies
/// stacked behind it take the others'.
struct Palette {
  int hue_dim = 0;
  int light_dim = -1;
  std::string colour(const Geometry& g, int rank) const {
    const Shape& c = g.coords[static_cast<std::size_t>(rank)];
    const double hues = static_cast<double>(g.mesh_shape[hue_dim]);
    const int hue = (210 + static_cast<int>(360.0 * static_cast<double>(c[hue_dim]) / hues)) % 360;
    double light = 58;
    if (light_dim >= 0)
      light = 40 + 36 * static_cast<double>(c[light_dim]) / static_cast<double>(g.mesh_shape[light_dim] - 1);
    return fmt::format("hsl({},62%,{:.0f}%)", hue, light);
  }
};

Palette palette(const Shape& mesh_shape) {
  std::vector<int> wide;
  for (int m = 0; m < static_cast<int>(mesh_shape.size()); ++m)
    if (mesh_shape[m] > 1) wide.push_back(m);
  Palette p;
  if (!wide.empty()) p.hue_dim = wide[0];
  if (wide.size() > 1) p.light_dim = wide[1];
  return p;
}

std::string coord_text(const Shape& coord) { return fmt::format("({})", fmt::join(coord, ",")); }

/// The mesh dims a layout is Partial over and their reduction, e.g.
/// "sum over tp"; empty without Partial.
std::string partial_text(const Layout& layout, const PictureOptions& options, std::string* op_name = nullptr) {
  std::vector<std::string> dims;
  std::string op;
  for (int m = 0; m < layout.mesh_ndim(); ++m)
    if (is_partial(layout[m])) {
      dims.push_back(mesh_dim_label(m, options));
      op = std::string(reduce_op_name(std::get<Partial>(layout[m]).op));
    }
  if (op_name) *op_name = op;
  if (dims.empty()) return {};
  return fmt::format("{} over {}", op, fmt::join(dims, ","));
}

/// How many of a tile's ranks are copies (Replicate dims) and how many are
/// parts of a pending reduction (Partial dims).
std::pair<std::int64_t, std::int64_t> copies_and_parts(const Geometry& g) {
  std::int64_t copies = 1, parts = 1;
  for (int m = 0; m < g.layout.mesh_ndim(); ++m) {
    if (is_replicate(g.layout[m])) copies *= g.mesh_shape[m];
    if (is_partial(g.layout[m])) parts *= g.mesh_shape[m];
  }
  return {copies, parts};
}

std::string ranks_text(const std::vector<int>& ranks) {
  if (ranks.size() <= 3) return "r" + fmt::format("{}", fmt::join(ranks, ",r"));
  return fmt::format("r{},r{},..r{}", ranks[0], ranks[1], ranks.back());
}

std::string box_text(const Box& b) {
  return fmt::format("offset [{}] size [{}]", fmt::join(b.offset, ","), fmt::join(b.size, ","));
}

struct GridScale {
  double sx = 0, sy = 0, width = 0, height = 0;
};

/// The grid in the tensor's own proportions (square elements) within a
/// kGridSide box, neither side under kMinGridSide (a long thin tensor stays
/// readable; its elements then are not square).
GridScale grid_scale(const Geometry& g) {
  const auto cols = static_cast<double>(std::max<std::int64_t>(g.col_dim >= 0 ? g.global_shape[g.col_dim] : 1, 1));
  const auto rows = static_cast<double>(std::max<std::int64_t>(g.row_dim >= 0 ? g.global_shape[g.row_dim] : 1, 1));
  GridScale s;
  if (g.row_dim < 0) {
    s.width = kGridSide, s.height = kMinGridSide;
  } else {
    const double side = kGridSide / std::max(rows, cols);
    s.width = std::max(kMinGridSide, cols * side);
    s.height = std::max(kMinGridSide, rows * side);
  }
  s.sx = s.width / cols;
  s.sy = s.height / rows;
  return s;
}

/// One tile: shadows for its other holders, the box in its holder's colour,
/// the hatching of a pending reduction, the label and a hover.
void draw_tile(std::string& out, const Geometry& g, const Tile& t, const GridScale& s, std::size_t panel,
               const PictureOptions& options) {
  const double x = g.col_dim >= 0 ? static_cast<double>(t.box.offset[g.col_dim]) * s.sx : 0;
  const double y = g.row_dim >= 0 ? static_cast<double>(t.box.offset[g.row_dim]) * s.sy : 0;
  const double w = g.col_dim >= 0 ? static_cast<double>(t.box.size[g.col_dim]) * s.sx : s.width;
  const double h = g.row_dim >= 0 ? static_cast<double>(t.box.size[g.row_dim]) * s.sy : s.height;
  const Palette pal = palette(g.mesh_shape);
  const std::string fill = pal.colour(g, t.ranks[0]);
  std::vector<std::string> holders;
  for (int r : t.ranks) holders.push_back(fmt::format("r{} {}", r, coord_text(g.coords[static_cast<std::size_t>(r)])));
  const std::int64_t bytes = t.box.numel() * static_cast<std::int64_t>(options.itemsize);
  out += fmt::format(R"(<g class="tile" data-panel="{}" data-ranks="{}" data-offset="{}" data-size="{}">)", panel,
                     fmt::join(t.ranks, " "), fmt::join(t.box.offset, ","), fmt::join(t.box.size, ","));
  out += fmt::format("<title>{}&#10;{}&#10;{} per rank</title>",
                     xml_escape(fmt::format("{}", fmt::join(holders, ", "))), box_text(t.box),
                     xml_escape(human_bytes(bytes)));
  const int shadows = std::min<int>(kMaxShadows, static_cast<int>(t.ranks.size()) - 1);
  for (int i = shadows; i >= 1; --i)
    out += fmt::format(R"(<rect class="copy" x="{:.2f}" y="{:.2f}" width="{:.2f}" height="{:.2f}" fill="{}" )"
                       R"(stroke="#333" stroke-width="0.6"/>)",
                       x + 4 * i, y - 4 * i, w, h, pal.colour(g, t.ranks[static_cast<std::size_t>(i)]));
  out += fmt::format(R"(<rect class="box" x="{:.2f}" y="{:.2f}" width="{:.2f}" height="{:.2f}" fill="{}" )"
                     R"(stroke="#222" stroke-width="1"/>)",
                     x, y, w, h, fill);
  std::string op;
  const std::string pending = partial_text(g.layout, options, &op);
  if (!op.empty())
    out += fmt::format(R"(<rect class="partial" data-op="{}" x="{:.2f}" y="{:.2f}" width="{:.2f}" height="{:.2f}" )"
                       R"~(fill="url(#hatch-{})" stroke="none"/>)~",
                       op, x, y, w, h, op);
  // Labels only where they fit; the hover says it all everywhere.
  std::vector<std::string> lines{ranks_text(t.ranks)};
  if (t.ranks.size() == 1) lines[0] += " " + coord_text(g.coords[static_cast<std::size_t>(t.ranks[0])]);
  const auto [copies, parts] = copies_and_parts(g);
  if (copies > 1) lines.push_back(fmt::format("x{} copies", copies));
  if (parts > 1) lines.push_back(fmt::format("{} parts: {}", parts, pending));
  const double font = 10;
  std::size_t widest = 0;
  for (const auto& l : lines) widest = std::max(widest, l.size());
  if (w >= static_cast<double>(widest) * font * 0.62 + 4 && h >= static_cast<double>(lines.size()) * (font + 2) + 2)
    for (std::size_t i = 0; i < lines.size(); ++i)
      out += fmt::format(R"(<text class="label" x="{:.2f}" y="{:.2f}" font-size="{}">{}</text>)", x + 3,
                         y + (font + 1) * static_cast<double>(i + 1), font, xml_escape(lines[i]));
  out += "</g>";
}

std::string panel_header(const Geometry& g, const std::vector<Range>& panel) {
  std::vector<std::string> parts;
  for (std::size_t i = 0; i < g.other_dims.size(); ++i)
    parts.push_back(fmt::format("dim {} [{}:{})", g.other_dims[i], panel[i].first, panel[i].second));
  return fmt::format("{}", fmt::join(parts, ", "));
}

/// The lines under the panels: what each mesh dim does, nesting orders,
/// empty shards, and what the colours mean.
std::vector<std::string> caption(const Geometry& g, const PictureOptions& options) {
  std::vector<std::string> lines;
  const Palette pal = palette(g.mesh_shape);
  for (int m = 0; m < g.layout.mesh_ndim(); ++m) {
    std::string role;
    if (m == pal.hue_dim && g.mesh_shape[m] > 1) role = " (colour)";
    if (m == pal.light_dim) role = " (lightness)";
    lines.push_back(fmt::format("mesh dim {} {} of {}: {}{}", m, mesh_dim_label(m, options), g.mesh_shape[m],
                                to_string(g.layout[m]), role));
  }
  for (int d = 0; d < static_cast<int>(g.global_shape.size()); ++d) {
    const std::vector<int> order = g.layout.split_order(d);
    if (order.size() < 2) continue;
    std::vector<std::string> names;
    for (int m : order) names.push_back(mesh_dim_label(m, options));
    lines.push_back(fmt::format("tensor dim {} is split by {} (outermost first)", d, fmt::join(names, " then ")));
  }
  std::vector<std::string> empty;
  for (std::size_t r = 0; r < g.boxes.size(); ++r)
    if (g.boxes[r].empty()) empty.push_back(fmt::format("r{} {}", r, coord_text(g.coords[r])));
  if (!empty.empty())
    lines.push_back(fmt::format("empty shards (0 elements): {}", fmt::join(empty, ", ")));
  return lines;
}

}  // namespace

std::string mesh_dim_label(int mesh_dim, const PictureOptions& options) {
  const auto m = static_cast<std::size_t>(mesh_dim);
  if (m < options.mesh_dim_names.size() && !options.mesh_dim_names[m].empty()) return options.mesh_dim_names[m];
  return fmt::format("d{}", mesh_dim);
}

std::string mesh_dims_label(std::span<const int> mesh_dims, const PictureOptions& options) {
  std::vector<std::string> labels;
  for (int m : mesh_dims) labels.push_back(mesh_dim_label(m, options));
  return fmt::format("{}", fmt::join(labels, ","));
}

Drawing draw_layout(const Shape& mesh_shape, const Shape& global_shape, const Layout& layout,
                    const PictureOptions& options) {
  const Geometry g = geometry(mesh_shape, global_shape, layout, options);
  const GridScale s = grid_scale(g);
  Drawing d;
  const std::string title = options.title.empty() ? fmt::format("{} of a {} tensor on a {} mesh", g.layout,
                                                                global_shape.empty() ? std::string("scalar")
                                                                                     : fmt::format("{}", fmt::join(global_shape, "x")),
                                                                fmt::join(mesh_shape, "x"))
                                                  : options.title;
  d.body += fmt::format(R"(<text class="title" x="{}" y="{}" font-size="14" font-weight="bold">{}</text>)", kMargin,
                        kMargin + 12, xml_escape(title));
  const double top = kMargin + 24;
  const bool headers = !g.other_dims.empty();
  const double cell_w = s.width + kPanelGap, cell_h = s.height + kPanelGap + (headers ? kPanelHeader : 0);
  const std::size_t per_row = std::min<std::size_t>(g.panels.size(), kPanelsPerRow);
  for (std::size_t p = 0; p < g.panels.size(); ++p) {
    const double px = kMargin + static_cast<double>(p % per_row) * cell_w;
    const double py = top + static_cast<double>(p / per_row) * cell_h;
    if (headers)
      d.body += fmt::format(R"(<text class="panel-title" x="{:.2f}" y="{:.2f}" font-size="11">{}</text>)", px,
                            py + 11, xml_escape(panel_header(g, g.panels[p])));
    const double gy = py + (headers ? kPanelHeader : 0) + 8;  // room for the copies' shadows
    d.body += fmt::format(R"~(<g class="panel" transform="translate({:.2f},{:.2f})">)~", px, gy);
    d.body += fmt::format(R"(<rect class="frame" x="0" y="0" width="{:.2f}" height="{:.2f}" fill="#f4f4f4" )"
                          R"(stroke="#999" stroke-dasharray="3,2"/>)",
                          s.width, s.height);
    for (const Tile& t : tiles_of(g, g.panels[p])) draw_tile(d.body, g, t, s, p, options);
    d.body += "</g>";
  }
  const std::size_t panel_rows = (g.panels.size() + per_row - 1) / per_row;
  double y = top + static_cast<double>(panel_rows) * cell_h;
  std::size_t widest = title.size() * 9 + 2 * static_cast<std::size_t>(kMargin);  // 14 px bold: about 9 px a character
  for (const std::string& line : caption(g, options)) {
    d.body += fmt::format(R"(<text class="caption" x="{}" y="{:.2f}" font-size="11">{}</text>)", kMargin, y,
                          xml_escape(line));
    y += kLine;
    widest = std::max(widest, line.size() * 6 + 20);
  }
  d.width = std::max(kMargin * 2 + static_cast<double>(per_row) * cell_w, static_cast<double>(widest));
  d.height = y + kMargin;
  return d;
}

std::string svg_document(const Drawing& drawing) {
  std::string out = fmt::format(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="{0:.0f}" height="{1:.0f}" viewBox="0 0 {0:.0f} {1:.0f}" )"
      R"(font-family="DejaVu Sans, Helvetica, Arial, sans-serif">)",
      drawing.width, drawing.height);
  // One hatching per reduction, told apart by angle as well as by label.
  out += "<defs>";
  const std::pair<const char*, int> hatches[] = {{"sum", 45}, {"avg", -45}, {"max", 0}, {"min", 90}};
  for (const auto& [op, angle] : hatches)
    out += fmt::format(R"(<pattern id="hatch-{}" patternUnits="userSpaceOnUse" width="7" height="7" )"
                       R"~(patternTransform="rotate({})"><line x1="0" y1="0" x2="0" y2="7" stroke="#111" )~"
                       R"(stroke-width="1.6" stroke-opacity="0.55"/></pattern>)",
                       op, angle);
  out += "</defs>";
  out += fmt::format(R"(<rect width="{:.0f}" height="{:.0f}" fill="white"/>)", drawing.width, drawing.height);
  out += drawing.body;
  out += "</svg>\n";
  return out;
}

}  // namespace detail

std::string xml_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\t':
      case '\n':
      case '\r': out += c; break;
      default:
        // XML 1.0 has no other control characters, escaped or not: a name
        // holding one would make the whole picture unreadable.
        out += static_cast<unsigned char>(c) < 0x20 ? '?' : c;
    }
  }
  return out;
}

std::string layout_svg(const Shape& mesh_shape, const Shape& global_shape, const Layout& layout,
                       const PictureOptions& options) {
  return detail::svg_document(detail::draw_layout(mesh_shape, global_shape, layout, options));
}

std::string to_svg(const DTensor& tensor, PictureOptions options) {
  if (options.mesh_dim_names.empty()) options.mesh_dim_names = tensor.mesh().dim_names();
  options.itemsize = itemsize(tensor.dtype());
  return layout_svg(tensor.mesh().shape(), tensor.shape(), tensor.placements(), options);
}

}  // namespace dtensor::pictures
