#include "layout_text.h"

#include "dtensor/redistribute/plan.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace dtensor::cli {
namespace {

struct RankBox {
  int rank;
  Shape coord;
  Box box;
};

using Interval = std::pair<std::int64_t, std::int64_t>;  // [begin, end)

// Widest a grid may get before it stops being readable.
constexpr int kMaxCols = 64;
constexpr int kMaxRows = 16;
constexpr int kMaxTableRanks = 64;
constexpr int kMaxHolderEntries = 8;

std::vector<RankBox> rank_boxes(const Shape& mesh_shape, const Shape& global_shape, const Layout& layout) {
  std::vector<RankBox> out;
  const std::int64_t n = numel(mesh_shape);
  for (std::int64_t r = 0; r < n; ++r) {
    Shape coord = unravel_index(r, mesh_shape);
    Box box = local_box(mesh_shape, global_shape, layout, coord);
    out.push_back({static_cast<int>(r), std::move(coord), std::move(box)});
  }
  return out;
}

std::string rank_set(const std::vector<int>& ranks) {
  constexpr std::size_t kShown = 12;
  if (ranks.size() <= kShown) return fmt::format("{{{}}}", fmt::join(ranks, ","));
  std::vector<int> head(ranks.begin(), ranks.begin() + kShown - 1);
  return fmt::format("{{{},...,{}}} ({} ranks)", fmt::join(head, ","), ranks.back(), ranks.size());
}

}  // namespace

std::string shape_text(const Shape& shape) {
  if (shape.empty()) return "scalar";
  if (shape.size() == 1) return fmt::format("{}-element", shape[0]);
  return fmt::format("{}", fmt::join(shape, "x"));
}

namespace {

std::string size_text(const Shape& size) { return shape_text(size); }

// The mesh dims (of more than one rank) whose placement satisfies `pred`.
template <class Pred>
std::vector<int> mesh_dims_where(const Shape& mesh_shape, const Layout& layout, Pred pred) {
  std::vector<int> dims;
  for (int m = 0; m < layout.mesh_ndim(); ++m)
    if (mesh_shape[m] > 1 && pred(layout[m])) dims.push_back(m);
  return dims;
}

std::string dims_text(const std::vector<int>& dims) {
  return fmt::format("mesh dim{} {}", dims.size() == 1 ? "" : "s", fmt::join(dims, " and "));
}

std::string reduce_words(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "the sum";
    case ReduceOp::Avg: return "the mean";
    case ReduceOp::Max: return "the elementwise max";
    case ReduceOp::Min: return "the elementwise min";
  }
  return "the reduction";
}

// "every rank holds a 32x32 shard (4 KiB)" or the smallest and largest.
std::string shard_summary(const std::vector<RankBox>& boxes, std::size_t itemsize) {
  auto by_numel = [](const RankBox& a, const RankBox& b) { return a.box.numel() < b.box.numel(); };
  const auto [lo, hi] = std::minmax_element(boxes.begin(), boxes.end(), by_numel);
  auto one = [&](const RankBox& b) {
    return fmt::format("{} ({})", size_text(b.box.size), human_bytes(byte_size(b.box.size, itemsize)));
  };
  bool same = std::all_of(boxes.begin(), boxes.end(), [&](const RankBox& b) { return b.box.size == lo->box.size; });
  if (same) return fmt::format("every rank holds a {} shard", one(*lo));
  if (hi->box.numel() == 0) return "every rank holds an empty shard";
  return fmt::format("shards range from {} on rank {} to {} on rank {}", one(*lo), lo->rank, one(*hi), hi->rank);
}

// Lines under a picture saying what replication, partial values and empty
// shards mean for this layout.
std::vector<std::string> legend(const Shape& mesh_shape, const Layout& layout,
                                const std::vector<std::vector<int>>& holders_per_block,
                                const std::vector<RankBox>& boxes, bool labelled) {
  std::vector<std::string> lines;
  auto reps = mesh_dims_where(mesh_shape, layout, [](const Placement& p) { return is_replicate(p); });
  auto parts = mesh_dims_where(mesh_shape, layout, [](const Placement& p) { return is_partial(p); });
  if (labelled && (!reps.empty() || !parts.empty()))
    lines.push_back("where several ranks hold a block, it shows the lowest of them");
  if (!reps.empty())
    lines.push_back(
        fmt::format("R: replicated over {}: each block is also held by the ranks that differ from it "
                    "only there",
                    dims_text(reps)));
  if (!parts.empty()) {
    ReduceOp op = std::get<Partial>(layout[parts.front()]).op;
    lines.push_back(
        fmt::format("P({}): values are partial over {}: each element is {} of the values its holders "
                    "hold (no single rank has it)",
                    op, dims_text(parts), reduce_words(op)));
  }
  if (!reps.empty() || !parts.empty()) {
    std::vector<std::string> entries;
    for (const auto& h : holders_per_block) {
      if (h.size() < 2) continue;
      if (entries.size() == kMaxHolderEntries) {
        entries.push_back("...");
        break;
      }
      entries.push_back(fmt::format("{} = {}", h.front(), rank_set(h)));
    }
    if (!entries.empty()) lines.push_back(fmt::format("held by: {}", fmt::join(entries, ", ")));
  }
  std::vector<int> empty;
  for (const RankBox& b : boxes)
    if (b.box.empty()) empty.push_back(b.rank);
  if (!empty.empty() && empty.size() < boxes.size())
    lines.push_back(fmt::format("rank{} {} hold{} an empty shard: torch.chunk leaves nothing for {}",
                                empty.size() == 1 ? "" : "s", rank_set(empty), empty.size() == 1 ? "s" : "",
                                empty.size() == 1 ? "it" : "them"));
  return lines;
}

std::string table(const Shape& mesh_shape, const Layout& layout, const std::vector<RankBox>& boxes,
                  const std::string& indent, std::string_view why) {
  std::string out;
  out += fmt::format("{}{}each rank's box (index ranges of the global tensor, end exclusive):\n", indent, why);
  const int coord_width = static_cast<int>(fmt::format("{}", fmt::join(boxes.back().coord, ",")).size()) + 2;
  const int rank_width = static_cast<int>(std::to_string(boxes.back().rank).size());
  int shown = 0;
  for (const RankBox& b : boxes) {
    if (shown++ == kMaxTableRanks) {
      out += fmt::format("{}  ... and {} more ranks\n", indent, boxes.size() - kMaxTableRanks);
      break;
    }
    const std::string head = fmt::format("rank {:>{}} ({}):", b.rank, rank_width, fmt::join(b.coord, ","));
    out += fmt::format("{}  {:<{}} {}  {}{}\n", indent, head, rank_width + coord_width + 7, b.box,
                       size_text(b.box.size), b.box.empty() && b.box.ndim() > 0 ? " (empty)" : "");
  }
  // Blocks held by several ranks, for the legend.
  std::vector<std::pair<Shape, int>> keyed;
  for (const RankBox& b : boxes)
    if (!b.box.empty() || b.box.ndim() == 0) {
      Shape key = b.box.offset;
      key.insert(key.end(), b.box.size.begin(), b.box.size.end());
      keyed.emplace_back(std::move(key), b.rank);
    }
  std::sort(keyed.begin(), keyed.end());
  std::vector<std::vector<int>> holders;
  for (std::size_t i = 0; i < keyed.size(); ++i) {
    if (i == 0 || keyed[i].first != keyed[i - 1].first) holders.emplace_back();
    holders.back().push_back(keyed[i].second);
  }
  std::sort(holders.begin(), holders.end());
  for (const std::string& line : legend(mesh_shape, layout, holders, boxes, false))
    out += fmt::format("{}{}\n", indent, line);
  return out;
}

// Distinct non-empty [begin, end) ranges of tensor dim d over all ranks.
std::vector<Interval> intervals(const std::vector<RankBox>& boxes, int d) {
  std::vector<Interval> out;
  for (const RankBox& b : boxes)
    if (b.box.size[d] > 0) out.emplace_back(b.box.offset[d], b.box.offset[d] + b.box.size[d]);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// `total` characters split over pieces in proportion to their extents, each
// at least `least` wide.
std::vector<int> proportional(const std::vector<Interval>& pieces, int total, int least) {
  // Rounded down, so that pieces of equal extent get equal widths.
  const double extent = static_cast<double>(pieces.back().second - pieces.front().first);
  std::vector<int> widths;
  for (const Interval& p : pieces)
    widths.push_back(std::max(least, static_cast<int>(static_cast<double>(total) * (p.second - p.first) / extent)));
  return widths;
}

std::size_t find_interval(const std::vector<Interval>& list, std::int64_t begin) {
  return static_cast<std::size_t>(
      std::find_if(list.begin(), list.end(), [&](const Interval& i) { return i.first == begin; }) - list.begin());
}

// Puts `text` into `line` at `at` if that does not run into earlier text.
void place(std::string& line, int at, const std::string& text, int& next_free) {
  if (at < next_free || at + static_cast<int>(text.size()) > static_cast<int>(line.size())) return;
  line.replace(static_cast<std::size_t>(at), text.size(), text);
  next_free = at + static_cast<int>(text.size()) + 1;
}

}  // namespace

std::string explain_placements(const Shape& mesh_shape, const Shape& global_shape, const Layout& layout,
                               const std::string& indent) {
  std::string out;
  for (int m = 0; m < layout.mesh_ndim(); ++m) {
    const std::int64_t k = mesh_shape[m];
    std::string what;
    if (auto* s = std::get_if<Shard>(&layout[m])) {
      std::vector<int> order = layout.split_order(s->dim);
      const int level = layout.level(m);
      if (level == 0)
        what = fmt::format("S({}) splits tensor dim {} (size {}) into {} chunk{}", s->dim, s->dim, global_shape[s->dim],
                           k, k == 1 ? "" : "s");
      else
        what = fmt::format(
            "S({}) splits each piece that mesh dim {} made of tensor dim {} again into {} chunk{} "
            "(nesting level {})",
            s->dim, order[level - 1], s->dim, k, k == 1 ? "" : "s", level);
    } else if (is_replicate(layout[m])) {
      what = k == 1 ? "R: a single rank, nothing to copy" : fmt::format("R: its {} ranks hold copies", k);
    } else {
      ReduceOp op = std::get<Partial>(layout[m]).op;
      what = fmt::format("P({}): its {} ranks hold partial values; the tensor is {} of them", op, k, reduce_words(op));
    }
    out += fmt::format("{}mesh dim {} ({} rank{}): {}\n", indent, m, k, k == 1 ? "" : "s", what);
  }
  return out;
}

std::string layout_text(const Shape& mesh_shape, const Shape& global_shape, std::size_t itemsize, const Layout& layout,
                        const std::string& indent) {
  const std::vector<RankBox> boxes = rank_boxes(mesh_shape, global_shape, layout);
  std::string out = fmt::format("{}{}\n", indent, shard_summary(boxes, itemsize));
  const int nd = static_cast<int>(global_shape.size());
  if (nd == 0 || nd > 2) return out + table(mesh_shape, layout, boxes, indent, "");
  if (numel(global_shape) == 0)
    return out + table(mesh_shape, layout, boxes, indent, "the tensor has no elements, nothing to draw; ");

  // Rows and columns of the picture: a 1-D tensor is one row.
  const bool two_d = nd == 2;
  const int col_dim = two_d ? 1 : 0;
  const std::vector<Interval> rows = two_d ? intervals(boxes, 0) : std::vector<Interval>{{0, 1}};
  const std::vector<Interval> cols = intervals(boxes, col_dim);
  const int label_width = static_cast<int>(std::to_string(boxes.back().rank).size());
  const int ncols = static_cast<int>(cols.size());
  const int nrows = static_cast<int>(rows.size());
  if (ncols * (label_width + 1) + 1 > kMaxCols + 32 || nrows > kMaxRows)
    return out +
           table(mesh_shape, layout, boxes, indent, fmt::format("{}x{} blocks are too many to draw; ", nrows, ncols));

  // Characters are about twice as tall as wide: keep the tensor's aspect.
  int width = kMaxCols, height = 1;
  if (two_d) {
    const double n0 = static_cast<double>(global_shape[0]), n1 = static_cast<double>(global_shape[1]);
    // Compared as a double: the ratio of two int64 sizes need not fit an int.
    const double tall = kMaxCols / 2.0 * n0 / n1;
    height = tall > kMaxRows ? kMaxRows : static_cast<int>(std::lround(tall));
    if (tall > kMaxRows) {
      width = std::max(24, static_cast<int>(std::lround(2.0 * kMaxRows * n1 / n0)));
    }
  }
  const std::vector<int> widths = proportional(cols, width - (ncols + 1), label_width);
  const std::vector<int> heights =
      two_d ? proportional(rows, std::max(height - (nrows + 1), nrows), 1) : std::vector<int>{1};

  // Holders of each block, lowest rank first.
  std::vector<std::vector<int>> holders(static_cast<std::size_t>(nrows * ncols));
  for (const RankBox& b : boxes) {
    if (b.box.empty()) continue;
    std::size_t r = two_d ? find_interval(rows, b.box.offset[0]) : 0;
    std::size_t c = find_interval(cols, b.box.offset[col_dim]);
    holders[r * ncols + c].push_back(b.rank);
  }

  // Border x positions, then the picture.
  std::vector<int> border{0};
  for (int w : widths) border.push_back(border.back() + w + 1);
  const int margin = two_d ? static_cast<int>(std::to_string(global_shape[0]).size()) + 1 : 0;
  const int total = margin + border.back() + 1;

  // Offsets of the column borders; the tensor's end first, so it always shows.
  std::string ticks(static_cast<std::size_t>(total), ' ');
  const std::string end_tick = std::to_string(cols.back().second);
  const int end_at = margin + border.back() - static_cast<int>(end_tick.size()) + 1;
  int next_free = 0;
  place(ticks, end_at, end_tick, next_free);
  std::string head(static_cast<std::size_t>(std::max(0, end_at - 1)), ' ');
  next_free = 0;
  for (int c = 0; c < ncols; ++c) place(head, margin + border[c], std::to_string(cols[c].first), next_free);
  ticks.replace(0, head.size(), head);
  while (!ticks.empty() && ticks.back() == ' ') ticks.pop_back();
  out += fmt::format("{}{}\n", indent,
                     two_d ? "tensor dim 0 runs down, dim 1 across; each block shows the rank holding it:"
                           : "the tensor (dim 0 runs across); each block shows the rank holding it:");
  out += fmt::format("{}{}\n", indent, ticks);

  auto separator = [&](std::int64_t row_tick) {
    std::string line = two_d ? fmt::format("{:>{}} ", row_tick, margin - 1) : "";
    line += '+';
    for (int w : widths) line += std::string(static_cast<std::size_t>(w), '-') + '+';
    return line;
  };
  for (int r = 0; r < nrows; ++r) {
    out += fmt::format("{}{}\n", indent, separator(rows[r].first));
    for (int l = 0; l < heights[r]; ++l) {
      std::string line(static_cast<std::size_t>(margin), ' ');
      line += '|';
      for (int c = 0; c < ncols; ++c) {
        std::string cell(static_cast<std::size_t>(widths[c]), ' ');
        const auto& h = holders[r * ncols + c];
        if (l == heights[r] / 2) {
          std::string label = h.empty() ? "?" : std::to_string(h.front());
          cell.replace(static_cast<std::size_t>((widths[c] - static_cast<int>(label.size())) / 2), label.size(), label);
        }
        line += cell + '|';
      }
      out += fmt::format("{}{}\n", indent, line);
    }
  }
  out += fmt::format("{}{}\n", indent, separator(rows.back().second));
  for (const std::string& line : legend(mesh_shape, layout, holders, boxes, true))
    out += fmt::format("{}{}\n", indent, line);
  return out;
}

}  // namespace dtensor::cli
