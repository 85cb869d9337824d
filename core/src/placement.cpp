#include "dtensor/core/placement.h"

#include <algorithm>
#include <cctype>
#include <charconv>

#include "dtensor/core/layout_rules.h"
#include "dtensor/core/error.h"
#include "dtensor/core/hash.h"
#include "dtensor/core/inline_vector.h"

namespace dtensor {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool parse_int(std::string_view s, std::int64_t& out) {
  s = trim(s);
  if (s.empty()) return false;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

// Splits on commas that are not inside parentheses or brackets.
std::vector<std::string_view> split_top_level(std::string_view text) {
  std::vector<std::string_view> parts;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '(' || c == '[') ++depth;
    if (c == ')' || c == ']') --depth;
    if (c == ',' && depth == 0) {
      parts.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  }
  parts.push_back(text.substr(start));
  return parts;
}

}  // namespace

std::string to_string(const Placement& p) {
  if (auto* s = std::get_if<Shard>(&p)) return fmt::format("S({})", s->dim);
  if (auto* q = std::get_if<Partial>(&p)) return fmt::format("P({})", q->op);
  return "R";
}

Placement parse_placement(std::string_view text) {
  std::string_view t = trim(text);
  auto bad = [&](std::string_view why) {
    return ParseError(fmt::format("[placement] '{}' {}: expected S(d), R or P(sum|avg|max|min)", text, why));
  };
  std::string_view head = t, arg;
  bool has_arg = false;
  if (auto open = t.find('('); open != std::string_view::npos) {
    if (t.back() != ')') throw bad("has no closing ')'");
    head = trim(t.substr(0, open));
    arg = trim(t.substr(open + 1, t.size() - open - 2));
    has_arg = true;
  }
  if (head == "S" || head == "Shard") {
    if (!has_arg) throw bad("needs a dim");
    if (arg.starts_with("dim")) {
      arg = trim(arg.substr(3));
      if (arg.empty() || arg.front() != '=') throw bad("is not a shard");
      arg = arg.substr(1);
    }
    std::int64_t dim = 0;
    if (!parse_int(arg, dim)) throw bad("has a dim that is not an integer");
    return Shard{dim};
  }
  if (head == "R" || head == "Replicate") {
    if (has_arg && !arg.empty()) throw bad("takes no argument");
    return Replicate{};
  }
  if (head == "P" || head == "Partial") {
    if (!has_arg || arg.empty()) return Partial{ReduceOp::Sum};
    if (arg.starts_with("reduce_op")) {
      arg = trim(arg.substr(9));
      if (arg.empty() || arg.front() != '=') throw bad("is not a partial");
      arg = trim(arg.substr(1));
    }
    if (arg.size() >= 2 && (arg.front() == '"' || arg.front() == '\'')) arg = arg.substr(1, arg.size() - 2);
    try {
      return Partial{parse_reduce_op(arg)};
    } catch (const ParseError&) {
      throw bad("has an unknown reduce op");
    }
  }
  throw bad("is not a placement");
}

void Layout::bad_mesh_dim(int mesh_dim) const {
  throw LayoutError(fmt::format("[layout] mesh dim {} of the layout '{}': expected a mesh dim in [0, {})", mesh_dim,
                                *this, mesh_ndim()));
}

Layout::Layout(std::vector<Placement> placements) : placements_(std::move(placements)) {
  levels_.assign(placements_.size(), -1);
  compact_levels();
}

Layout::Layout(std::vector<Placement> placements,
               std::span<const std::pair<std::int64_t, std::vector<int>>> split_order)
    : Layout(std::move(placements)) {
  for (const auto& [dim, mesh_dims] : split_order) {
    std::vector<int> expected;
    for (int m = 0; m < mesh_ndim(); ++m)
      if (is_shard(placements_[m], dim)) expected.push_back(m);
    std::vector<int> given = mesh_dims;
    std::sort(given.begin(), given.end());
    if (given != expected)
      throw LayoutError(
          fmt::format("[layout] split order [{}] for tensor dim {}: expected exactly the mesh dims that shard it, [{}]",
                      fmt::join(mesh_dims, ","), dim, fmt::join(expected, ",")));
    for (std::size_t i = 0; i < mesh_dims.size(); ++i) levels_[mesh_dims[i]] = static_cast<int>(i);
  }
}

void Layout::compact_levels() {
  // Shards that have no level yet go innermost, in mesh-dim order; then
  // levels of each tensor dim are renumbered 0..k-1 keeping their order.
  const int n = mesh_ndim();
  // On the stack for the usual few mesh dims: propagation builds many
  // layouts on a cache miss.
  InlineVector<std::int64_t, 8> dims(static_cast<std::size_t>(n), -1);
  for (int m = 0; m < n; ++m) {
    if (const auto* s = std::get_if<Shard>(&placements_[m])) {
      dims[m] = s->dim;
      if (levels_[m] < 0) levels_[m] = kInnermost;
    } else {
      levels_[m] = -1;
    }
  }
  normalize_levels(dims, levels_);
}

Layout Layout::parse(std::string_view text) {
  std::vector<Placement> placements;
  std::vector<int> given_levels;
  bool any_level = false;
  std::string_view t = trim(text);
  if (t.empty()) throw ParseError(fmt::format("[placement] empty placement list: expected e.g. S(0),R,P(sum)"));
  const std::vector<std::string_view> parts = split_top_level(t);
  for (std::size_t i = 0; i < parts.size(); ++i) {
    std::string_view part = trim(parts[i]);
    int level = -1;
    if (!part.empty() && part.back() == ']') {
      auto open = part.rfind('[');
      std::int64_t v = 0;
      if (open == std::string_view::npos || !parse_int(part.substr(open + 1, part.size() - open - 2), v) || v < 0)
        throw ParseError(
            fmt::format("[placement] '{}' in '{}': a nesting level is written S(d)[k] with k >= 0", part, text));
      // Levels of one dim are 0..(its shards - 1): a level is below the
      // number of placements, which also keeps it inside an int.
      if (v >= static_cast<std::int64_t>(parts.size()))
        throw ParseError(
            fmt::format("[placement] '{}' in '{}': nesting level {} is out of range: expected 0..{} "
                        "(levels count a dim's shards from the outermost)",
                        part, text, v, parts.size() - 1));
      level = static_cast<int>(v);
      part = trim(part.substr(0, open));
      any_level = true;
    }
    // An empty part has nothing of its own to quote: name its place in the
    // whole text.
    if (part.empty())
      throw ParseError(fmt::format("[placement] placement {} of '{}' is empty: expected S(d), R or P(sum|avg|max|min)",
                                   i + 1, text));
    Placement p = parse_placement(part);
    if (level >= 0 && !is_shard(p))
      throw ParseError(fmt::format("[placement] '{}' in '{}': only a shard has a nesting level", part, text));
    placements.push_back(p);
    given_levels.push_back(level);
  }
  if (!any_level) return Layout(std::move(placements));
  // Build the split order per tensor dim from the given levels.
  std::vector<std::pair<std::int64_t, std::vector<int>>> order;
  for (std::size_t m = 0; m < placements.size(); ++m) {
    if (!is_shard(placements[m])) continue;
    std::int64_t dim = std::get<Shard>(placements[m]).dim;
    auto it = std::find_if(order.begin(), order.end(), [&](auto& e) { return e.first == dim; });
    if (it != order.end()) continue;
    // Levels are given per tensor dim: to every shard of it, or to none
    // (which nest left to right).
    std::vector<std::pair<int, int>> by_level;
    int without = -1;  // a mesh dim sharding `dim` with no level
    for (std::size_t o = 0; o < placements.size(); ++o)
      if (is_shard(placements[o], dim)) {
        if (given_levels[o] < 0)
          without = static_cast<int>(o);
        else
          by_level.emplace_back(given_levels[o], static_cast<int>(o));
      }
    if (by_level.empty()) continue;
    if (without >= 0)
      throw ParseError(
          fmt::format("[placement] '{}': S({}) on mesh dim {} has no nesting level but S({}) on mesh dim {} has one: "
                      "give a "
                      "nesting level to every shard of dim {} or to none",
                      text, dim, without, dim, by_level.front().second, dim));
    std::sort(by_level.begin(), by_level.end());
    for (std::size_t i = 0; i < by_level.size(); ++i)
      if (by_level[i].first != static_cast<int>(i))
        throw ParseError(fmt::format("[placement] '{}': the nesting levels of dim {} must be 0..{}", text, dim,
                                     by_level.size() - 1));
    std::vector<int> mesh_dims;
    for (auto& [lvl, m] : by_level) mesh_dims.push_back(m);
    order.emplace_back(dim, std::move(mesh_dims));
  }
  return Layout(std::move(placements), order);
}

Layout Layout::replicated(int mesh_ndim) { return Layout(std::vector<Placement>(mesh_ndim, Replicate{})); }

std::vector<int> Layout::split_order(std::int64_t dim) const {
  std::vector<int> dims;
  for (int m = 0; m < mesh_ndim(); ++m)
    if (is_shard(placements_[m], dim)) dims.push_back(m);
  std::sort(dims.begin(), dims.end(), [&](int a, int b) { return levels_[a] < levels_[b]; });
  return dims;
}

int Layout::innermost(std::int64_t dim) const {
  int best = -1;
  for (int m = 0; m < mesh_ndim(); ++m)
    if (is_shard(placements_[m], dim) && (best < 0 || levels_[m] > levels_[best])) best = m;
  return best;
}

bool Layout::has_partial() const {
  return std::any_of(placements_.begin(), placements_.end(), [](const Placement& p) { return is_partial(p); });
}

bool Layout::default_order() const {
  for (int m = 0; m < mesh_ndim(); ++m) {
    if (!is_shard(placements_[m])) continue;
    int expected = 0;
    for (int o = 0; o < m; ++o)
      if (is_shard(placements_[o], std::get<Shard>(placements_[m]).dim)) ++expected;
    if (levels_[m] != expected) return false;
  }
  return true;
}

Layout Layout::resolved(int ndim) const {
  Layout out = *this;
  for (int m = 0; m < mesh_ndim(); ++m) {
    if (auto* s = std::get_if<Shard>(&out.placements_[m])) {
      std::int64_t d = s->dim < 0 ? s->dim + ndim : s->dim;
      if (d < 0 || d >= ndim)
        throw LayoutError(fmt::format("[layout] Shard({}) on mesh dim {}: the tensor has {} dims", s->dim, m, ndim));
      s->dim = d;
    }
  }
  // Levels stay: resolving does not change which shards share a dim unless a
  // negative and a positive spelling met, in which case compact keeps order.
  out.compact_levels();
  return out;
}

Layout Layout::without_partial() const {
  Layout out = *this;
  for (int m = 0; m < mesh_ndim(); ++m)
    if (is_partial(placements_[static_cast<std::size_t>(m)])) out = out.with(m, Replicate{});
  return out;
}

Layout Layout::with(int mesh_dim, const Placement& p) const {
  Layout out = *this;
  out.placements_.at(mesh_dim) = p;
  out.levels_[mesh_dim] = is_shard(p) ? kInnermost : -1;
  out.compact_levels();
  return out;
}

std::size_t Layout::hash() const {
  std::size_t h = 0x9e3779b97f4a7c15ull;
  for (int m = 0; m < mesh_ndim(); ++m) {
    const Placement& p = placements_[m];
    hash_combine(h, p.index());
    if (auto* s = std::get_if<Shard>(&p)) hash_combine(h, static_cast<std::uint64_t>(s->dim));
    if (auto* q = std::get_if<Partial>(&p)) hash_combine(h, static_cast<std::uint64_t>(q->op));
    hash_combine(h, static_cast<std::uint64_t>(levels_[m] + 1));
  }
  return h;
}

Layout validate_layout(const Layout& layout, std::span<const std::int64_t> mesh_shape,
                       std::span<const std::int64_t> global_shape) {
  // The placements must match the mesh before anything else is read: a
  // layout made for another mesh is named as such whatever the shape. The
  // shard dims are judged against the tensor's dims, so after the shape.
  auto problem = layout_problem(layout.placements(), mesh_shape.size(), global_shape.size());
  if (problem && problem->kind == LayoutProblem::Kind::MeshDims)
    throw LayoutError(fmt::format("[layout] {}", describe(*problem, layout, mesh_shape)));
  check_shape(global_shape, "layout");
  if (problem) throw LayoutError(fmt::format("[layout] {}", describe(*problem, layout, mesh_shape)));
  return layout.resolved(static_cast<int>(global_shape.size()));
}

Box local_box(std::span<const std::int64_t> mesh_shape, std::span<const std::int64_t> global_shape,
              const Layout& layout, std::span<const std::int64_t> coord) {
  Box box = full_box(global_shape);
  const int nd = static_cast<int>(global_shape.size());
  for (int d = 0; d < nd; ++d) {
    for (int m : layout.split_order(d)) {
      Chunk c = chunk(box.size[d], mesh_shape[m], coord[m]);
      box.offset[d] += c.offset;
      box.size[d] = c.size;
    }
  }
  return box;
}

}  // namespace dtensor

fmt::format_context::iterator fmt::formatter<dtensor::Layout>::format(const dtensor::Layout& l,
                                                                      fmt::format_context& ctx) const {
  auto out = ctx.out();
  const bool levels = !l.default_order();
  for (int m = 0; m < l.mesh_ndim(); ++m) {
    out = fmt::format_to(out, "{}{}", m ? "," : "", dtensor::to_string(l[m]));
    if (levels && dtensor::is_shard(l[m])) out = fmt::format_to(out, "[{}]", l.level(m));
  }
  return out;
}
