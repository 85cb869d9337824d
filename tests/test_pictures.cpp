// Layout and plan pictures, read back as a person's SVG viewer would: the
// SVG is parsed as XML and its tiles are checked against the boxes
// local_box gives each rank, over random meshes, shapes and layouts
// (uneven, empty, nested, Partial, 1-4 dims).
#include <boost/property_tree/ptree.hpp>
#include <boost/property_tree/xml_parser.hpp>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>

#include <dtensor/dtensor.h>
#include <dtensor/pictures/svg.h>
#include <dtensor/redistribute/planner.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "support.h"

namespace pictures_suite {
using namespace dtensor;
namespace pt = boost::property_tree;

/// What a parsed picture holds, element by element.
struct TileSeen {
  std::size_t panel = 0;
  std::vector<int> ranks;
  Shape offset, size;
  double width = -1, height = -1;  // the rect.box
  int hatched = 0;                 // rect.partial children
  std::string op;                  // their data-op
  std::vector<std::string> labels;
};

struct PictureSeen {
  std::vector<TileSeen> tiles;
  std::vector<std::string> texts;  // every <text>, in order
  int hatch_patterns = 0;
  int steps = 0;        // g.step (plan pictures)
  int plan_panels = 0;  // g.plan-panel
};

Shape numbers(const std::string& text) {
  Shape out;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) out.push_back(std::stoll(part));
  return out;
}

std::string attr(const pt::ptree& node, const std::string& name) {
  return node.get<std::string>("<xmlattr>." + name, "");
}

void walk(const pt::ptree& node, PictureSeen& seen, TileSeen* tile) {
  for (const auto& [tag, child] : node) {
    if (tag == "<xmlattr>" || tag == "<xmlcomment>") continue;
    const std::string cls = attr(child, "class");
    if (tag == "pattern" && attr(child, "id").rfind("hatch-", 0) == 0) ++seen.hatch_patterns;
    if (tag == "text") {
      seen.texts.push_back(child.data());
      if (tile && cls == "label") tile->labels.push_back(child.data());
    }
    if (tag == "g" && cls == "step") ++seen.steps;
    if (tag == "g" && cls == "plan-panel") ++seen.plan_panels;
    if (tag == "g" && cls == "tile") {
      TileSeen t;
      t.panel = std::stoul(attr(child, "data-panel"));
      std::stringstream ranks(attr(child, "data-ranks"));
      for (int r; ranks >> r;) t.ranks.push_back(r);
      t.offset = numbers(attr(child, "data-offset"));
      t.size = numbers(attr(child, "data-size"));
      walk(child, seen, &t);
      seen.tiles.push_back(t);
      continue;
    }
    if (tile && tag == "rect" && cls == "box") {
      tile->width = child.get<double>("<xmlattr>.width");
      tile->height = child.get<double>("<xmlattr>.height");
    }
    if (tile && tag == "rect" && cls == "partial") {
      ++tile->hatched;
      tile->op = attr(child, "data-op");
    }
    walk(child, seen, tile);
  }
}

PictureSeen parse(const std::string& svg) {
  std::stringstream in(svg);
  pt::ptree tree;
  pt::read_xml(in, tree);  // throws on anything that is not well-formed XML
  PictureSeen seen;
  walk(tree, seen, nullptr);
  return seen;
}

pictures::PictureOptions named() {
  pictures::PictureOptions o;
  o.mesh_dim_names = {"dp", "tp"};
  return o;
}

bool any_text_contains(const PictureSeen& p, const std::string& what) {
  for (const auto& t : p.texts)
    if (t.find(what) != std::string::npos) return true;
  return false;
}

/// Checks one layout picture against the boxes; returns what is wrong.
std::string check_layout_picture(const Shape& mesh_shape, const Shape& shape, const Layout& layout, int row_dim,
                                 int col_dim) {
  pictures::PictureOptions options;
  options.row_dim = row_dim;
  options.col_dim = col_dim;
  const PictureSeen p = parse(pictures::layout_svg(mesh_shape, shape, layout, options));
  const Layout v = validate_layout(layout, mesh_shape, shape);
  const std::int64_t ranks = numel(mesh_shape);
  std::int64_t holders_per_box = 1;
  bool partial = false;
  for (int m = 0; m < v.mesh_ndim(); ++m) {
    if (!is_shard(v[m])) holders_per_box *= mesh_shape[m];
    partial = partial || is_partial(v[m]);
  }
  std::set<int> drawn, empty;
  for (std::int64_t r = 0; r < ranks; ++r)
    if (local_box(mesh_shape, shape, v, unravel_index(r, mesh_shape)).empty()) empty.insert(static_cast<int>(r));
  std::map<std::size_t, std::int64_t> area;  // per panel, grid elements covered
  double sx = -1, sy = -1;
  const int nd = static_cast<int>(shape.size());
  const int col = nd == 0 ? -1 : (col_dim >= 0 ? col_dim : (row_dim == nd - 1 ? nd - 2 : nd - 1));
  const int row = nd < 2 ? -1 : (row_dim >= 0 ? row_dim : (col == nd - 1 ? nd - 2 : nd - 1));
  for (const TileSeen& t : p.tiles) {
    if (static_cast<std::int64_t>(t.ranks.size()) != holders_per_box)
      return fmt::format("a tile has ranks {} where each box has {} holders", fmt::join(t.ranks, " "),
                         holders_per_box);
    for (int r : t.ranks) {
      const Box b = local_box(mesh_shape, shape, v, unravel_index(r, mesh_shape));
      if (b.offset != t.offset || b.size != t.size)
        return fmt::format("rank {} is drawn at offset [{}] size [{}] but holds offset [{}] size [{}]", r,
                           fmt::join(t.offset, ","), fmt::join(t.size, ","), fmt::join(b.offset, ","),
                           fmt::join(b.size, ","));
      if (empty.count(r)) return fmt::format("rank {} holds nothing but is drawn", r);
      drawn.insert(r);
    }
    const std::int64_t cols = col >= 0 ? t.size[col] : 1, rows = row >= 0 ? t.size[row] : 1;
    area[t.panel] += cols * rows;
    // One scale per axis for the whole picture: sizes in proportion.
    if (col >= 0) {
      const double s = t.width / static_cast<double>(cols);
      if (sx < 0) sx = s;
      if (!testing::close(s, sx, 0.02)) return fmt::format("tile widths are not in proportion: {} vs {} per column", s, sx);
    }
    if (row >= 0) {
      const double s = t.height / static_cast<double>(rows);
      if (sy < 0) sy = s;
      if (!testing::close(s, sy, 0.02)) return fmt::format("tile heights are not in proportion: {} vs {} per row", s, sy);
    }
    if (t.hatched != (partial ? 1 : 0))
      return fmt::format("a tile has {} hatchings for a layout {} Partial", t.hatched, partial ? "with" : "without");
    if (!t.labels.empty() && t.labels[0].rfind(fmt::format("r{}", t.ranks[0]), 0) != 0)
      return fmt::format("a tile of ranks {} is labelled '{}'", fmt::join(t.ranks, " "), t.labels[0]);
  }
  // The boxes of the distinct tiles cover each panel's grid exactly.
  const std::int64_t grid = (col >= 0 ? shape[col] : 1) * (row >= 0 ? shape[row] : 1);
  for (const auto& [panel, covered] : area)
    if (covered != grid) return fmt::format("panel {} is covered by {} of {} elements", panel, covered, grid);
  if (static_cast<std::int64_t>(drawn.size() + empty.size()) != ranks)
    return fmt::format("{} ranks drawn and {} empty of {}", drawn.size(), empty.size(), ranks);
  if (!empty.empty() && !any_text_contains(p, "empty shards")) return "empty shards are not named";
  if (!any_text_contains(p, fmt::format("{}", v))) return "the title does not give the layout";
  bool nested = false;
  for (int d = 0; d < nd; ++d) nested = nested || v.split_order(d).size() > 1;
  if (nested != any_text_contains(p, "is split by")) return "the nesting caption is wrong";
  if (p.hatch_patterns != 4) return fmt::format("{} hatch patterns defined, expected 4", p.hatch_patterns);
  return {};
}

}  // namespace pictures_suite
using namespace pictures_suite;

BOOST_AUTO_TEST_SUITE(layout_pictures)

BOOST_AUTO_TEST_CASE(a_2x2_mesh_of_an_8x6_tensor_is_four_equal_tiles) {
  const PictureSeen p = parse(pictures::layout_svg({2, 2}, {8, 6}, Layout::parse("S(0),S(1)")));
  BOOST_TEST_REQUIRE(p.tiles.size() == 4u);
  for (const TileSeen& t : p.tiles) {
    BOOST_TEST(t.ranks.size() == 1u);
    BOOST_TEST(t.width == p.tiles[0].width);
    BOOST_TEST(t.height / t.width == 4.0 / 3.0, boost::test_tools::tolerance(1e-9));  // 4x3 elements, square
    BOOST_TEST(t.hatched == 0);
    BOOST_TEST_REQUIRE(!t.labels.empty());
  }
  BOOST_TEST(p.tiles[3].labels[0] == "r3 (1,1)");
  BOOST_TEST(p.tiles[3].offset == (Shape{4, 3}));
}

BOOST_AUTO_TEST_CASE(uneven_and_empty_shards_are_drawn_as_they_are) {
  // 5 rows over 4 ranks: torch.chunk gives 2, 2, 1 and an empty fourth.
  const PictureSeen p = parse(pictures::layout_svg({4}, {5, 4}, Layout::parse("S(0)")));
  BOOST_TEST_REQUIRE(p.tiles.size() == 3u);
  BOOST_TEST(p.tiles[0].height == 2 * p.tiles[2].height);
  BOOST_TEST(any_text_contains(p, "empty shards (0 elements): r3 (3)"));
}

BOOST_AUTO_TEST_CASE(replicate_stacks_copies_and_partial_is_hatched_with_its_reduction) {
  const PictureSeen p = parse(pictures::layout_svg({2, 3}, {4, 6}, Layout::parse("R,P(max)"), named()));
  BOOST_TEST_REQUIRE(p.tiles.size() == 1u);
  BOOST_TEST(p.tiles[0].ranks.size() == 6u);
  BOOST_TEST(p.tiles[0].hatched == 1);
  BOOST_TEST(p.tiles[0].op == "max");
  const auto& labels = p.tiles[0].labels;
  BOOST_TEST_REQUIRE(labels.size() == 3u);
  BOOST_TEST(labels[1] == "x2 copies");
  BOOST_TEST(labels[2] == "3 parts: max over tp");
  const PictureSeen plain = parse(pictures::layout_svg({2, 3}, {4, 6}, Layout::parse("R,S(1)")));
  for (const TileSeen& t : plain.tiles) BOOST_TEST(t.hatched == 0);
}

BOOST_AUTO_TEST_CASE(nested_orders_are_spelled_out) {
  const PictureSeen p =
      parse(pictures::layout_svg({2, 2}, {8, 2}, Layout::parse("S(0)[1],S(0)[0]"), named()));
  BOOST_TEST(any_text_contains(p, "tensor dim 0 is split by tp then dp (outermost first)"));
  // tp splits first: rank 1 (dp 0, tp 1) holds rows 4-5.
  for (const TileSeen& t : p.tiles)
    if (t.ranks == std::vector<int>{1}) BOOST_TEST(t.offset == (Shape{4, 0}));
}

BOOST_AUTO_TEST_CASE(other_dims_become_small_multiples) {
  // 3-D: dim 0 split over 2 ranks draws two panels of dims 1 and 2.
  const PictureSeen p = parse(pictures::layout_svg({2}, {4, 3, 5}, Layout::parse("S(0)")));
  BOOST_TEST(p.tiles.size() == 2u);
  std::set<std::size_t> panels;
  for (const TileSeen& t : p.tiles) panels.insert(t.panel);
  BOOST_TEST(panels.size() == 2u);
  BOOST_TEST(any_text_contains(p, "dim 0 [2:4)"));
}

BOOST_AUTO_TEST_CASE(random_layouts_match_their_boxes) {
  std::mt19937_64 rng(2026);
  const std::size_t cases = testing::scaled_cases(300, 40);
  for (std::size_t i = 0; i < cases; ++i) {
    const int mesh_nd = 1 + static_cast<int>(rng() % 4);
    Shape mesh_shape;
    for (int m = 0; m < mesh_nd; ++m) mesh_shape.push_back(1 + static_cast<std::int64_t>(rng() % (mesh_nd > 2 ? 2 : 4)));
    const int nd = 1 + static_cast<int>(rng() % 4);
    Shape shape;
    for (int d = 0; d < nd; ++d) shape.push_back(static_cast<std::int64_t>(rng() % (nd > 2 ? 5 : 11)));
    const ReduceOp op = static_cast<ReduceOp>(rng() % 4);
    const Layout layout = testing::random_layout(rng, mesh_nd, nd, op, 2);
    int row_dim = -1, col_dim = -1;
    if (nd >= 2 && rng() % 3 == 0) {
      col_dim = static_cast<int>(rng() % nd);
      row_dim = static_cast<int>((col_dim + 1 + static_cast<int>(rng() % (nd - 1))) % nd);
    }
    std::string why;
    try {
      why = check_layout_picture(mesh_shape, shape, layout, row_dim, col_dim);
    } catch (const std::exception& e) {
      why = std::string("threw: ") + e.what();
    }
    BOOST_TEST(why.empty(), fmt::format("seed 2026 case {}: {} of {} on mesh {} rows {} cols {}: {}", i, layout,
                                        fmt::join(shape, "x"), fmt::join(mesh_shape, "x"), row_dim, col_dim, why));
  }
}

BOOST_AUTO_TEST_CASE(bad_layouts_and_options_are_typed_errors) {
  BOOST_CHECK_THROW(pictures::layout_svg({2}, {4}, Layout::parse("S(1)")), LayoutError);
  BOOST_CHECK_THROW(pictures::layout_svg({2, 2}, {4}, Layout::parse("S(0)")), LayoutError);
  pictures::PictureOptions bad;
  bad.row_dim = 2;
  BOOST_CHECK_THROW(pictures::layout_svg({2}, {4, 4}, Layout::parse("S(0)"), bad), ValueError);
  bad.row_dim = bad.col_dim = 1;
  BOOST_CHECK_THROW(pictures::layout_svg({2}, {4, 4}, Layout::parse("S(0)"), bad), ValueError);
}

BOOST_AUTO_TEST_CASE(a_dtensor_draws_with_its_mesh_names_and_dtype) {
  testing::FailureLog log;
  std::vector<std::string> pictures_per_rank(4);
  run_threads(4, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {2, 2}, {"dp", "tp"});
    DTensor t = DTensor::from_local(Tensor::zeros({3, 2}, DType::Float64), mesh, Layout::parse("S(0),S(1)"));
    pictures_per_rank[static_cast<std::size_t>(comm.rank())] = pictures::to_svg(t);
  });
  // The same picture on every rank, without any communication.
  for (const auto& svg : pictures_per_rank) BOOST_TEST(svg == pictures_per_rank[0]);
  const PictureSeen p = parse(pictures_per_rank[0]);
  BOOST_TEST(any_text_contains(p, "mesh dim 1 tp of 2: S(1) (lightness)"));
  BOOST_TEST(pictures_per_rank[0].find("48 B per rank") != std::string::npos);  // 3x2 f64
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(decision_pictures)

BOOST_AUTO_TEST_CASE(explain_pictures_draws_each_op_as_it_was_decided) {
  testing::FailureLog log;
  std::vector<std::string> drawn;
  std::vector<std::string> lines;
  run_threads(2, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {2}, {"tp"});
    // Both operands split on their columns: the matmul cannot take them as
    // they are, so one of them moves.
    const DTensor a = distribute_tensor(testing::integer_tensor({4, 6}, DType::Float64, 1), mesh, Layout::parse("S(1)"));
    const DTensor b = distribute_tensor(testing::integer_tensor({6, 4}, DType::Float64, 2), mesh, Layout::parse("S(1)"));
    std::vector<std::string> mine, text;
    {
      pictures::ExplainPictures pictures({}, [&](const std::string& line) { text.push_back(line); });
      (void)matmul(a, b);
      mine = pictures.svgs();
    }
    if (mine.size() != 1) log.add(fmt::format("rank {}: {} pictures for one op", comm.rank(), mine.size()));
    if (comm.rank() == 0) drawn = mine, lines = text;
  });
  testing::check_no_failures(log.failures);
  BOOST_TEST_REQUIRE(drawn.size() == 1u);
  const std::string& svg = drawn[0];
  std::stringstream in(svg);
  pt::ptree tree;
  BOOST_REQUIRE_NO_THROW(pt::read_xml(in, tree));
  const PictureSeen p = parse(svg);
  BOOST_TEST(any_text_contains(p, "matmul: chose ["));
  // Each input is drawn as called, and again where it moved; then the output.
  const auto count = [&](const std::string& needle) {
    std::size_t n = 0;
    for (auto at = svg.find(needle); at != std::string::npos; at = svg.find(needle, at + 1)) ++n;
    return n;
  };
  const std::size_t moves = count(R"(<g class="move">)"), stays = count(R"(class="stays")");
  BOOST_TEST(moves + stays == 2u);
  BOOST_TEST(moves >= 1u);
  BOOST_TEST(count(R"(class="decision-panel")") == 2u + moves + 1u);
  BOOST_TEST_REQUIRE(!lines.empty());
  BOOST_TEST(lines.back().find("matmul: inputs") != std::string::npos, lines.back());
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(plan_pictures)

BOOST_AUTO_TEST_CASE(one_panel_per_step_and_an_arrow_between) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20; ++i) {
    const Shape mesh_shape{2, 2};
    const Shape shape{8, 6};
    const Layout from = testing::random_layout(rng, 2, 2, ReduceOp::Sum, 2);
    const Layout to = testing::random_layout(rng, 2, 2, ReduceOp::Sum, 0);
    const Plan& plan = cached_plan(PlanRequest{mesh_shape, shape, DType::Float32, from, to});
    const std::string svg = pictures::plan_svg(plan, named());
    const PictureSeen p = parse(svg);
    BOOST_TEST(p.plan_panels == static_cast<int>(plan.steps.size()) + 1, fmt::format("{} -> {}", from, to));
    BOOST_TEST(p.steps == static_cast<int>(plan.steps.size()));
    for (std::size_t s = 0; s < plan.steps.size(); ++s)
      BOOST_TEST(any_text_contains(p, fmt::format("step {}: {}", s + 1, step_name(plan.steps[s].kind))),
                 fmt::format("{} -> {} step {}", from, to, s + 1));
  }
}

// The runner-up is priced in the caption, in the units of the chosen plan's
// own caption, and it never beats the chosen plan on what decided (bytes
// first, then time).
BOOST_AUTO_TEST_CASE(the_runner_up_is_priced_under_the_caption) {
  std::mt19937_64 rng(11);
  int with_runner_up = 0;
  for (int i = 0; i < 40; ++i) {
    const Shape mesh_shape = i % 2 == 0 ? Shape{2, 2} : Shape{2, 3};
    const Shape shape{12, 7};
    const Layout from = testing::random_layout(rng, 2, 2, ReduceOp::Sum, 0);
    const Layout to = testing::random_layout(rng, 2, 2, ReduceOp::Sum, 0);
    const Plan& plan = cached_plan(PlanRequest{mesh_shape, shape, DType::Float32, from, to});
    const std::string svg = pictures::plan_svg(plan, named());
    const std::string where = fmt::format("{} -> {} on {}", from, to, fmt::join(mesh_shape, "x"));
    const bool drawn = svg.find(R"(class="runner-up")") != std::string::npos;
    BOOST_TEST(drawn == plan.runner_up.has_value(), where);
    if (!plan.runner_up) continue;
    ++with_runner_up;
    const PlanRunnerUp& r = *plan.runner_up;
    BOOST_TEST(!r.kinds.empty(), where);
    BOOST_TEST(r.est_seconds > 0, where);
    BOOST_TEST((r.bytes > plan.max_recv_bytes() ||
                (r.bytes == plan.max_recv_bytes() && r.est_seconds >= plan.est_seconds * (1 - 1e-9))),
               where << ": runner-up " << r.bytes << " B, " << r.est_seconds << " s; chosen " << plan.max_recv_bytes()
                     << " B, " << plan.est_seconds << " s");
    const PictureSeen p = parse(svg);
    BOOST_TEST(any_text_contains(p, fmt::format("runner-up: {}, {} to the busiest rank", fmt::join(r.kinds, "+"),
                                                human_bytes(r.bytes))),
               where);
  }
  BOOST_TEST(with_runner_up >= 10, "only " << with_runner_up << " of 40 plans had a runner-up");
}

BOOST_AUTO_TEST_SUITE_END()

namespace pictures_suite {

/// What a timeline picture shows of one rank: its boxes in drawing order.
struct RankRowSeen {
  std::vector<double> collective_x;  // left edges, in program order
  std::vector<std::string> collective_kinds;
  int ops = 0;
  std::vector<std::string> scopes;  // their titles' first lines
};

struct TimelineSeen {
  std::map<int, RankRowSeen> rows;  // by pid
  int sync_lines = 0;
  std::vector<std::string> legend;
};

void walk_timeline(const pt::ptree& node, TimelineSeen& seen, RankRowSeen* row) {
  for (const auto& [tag, child] : node) {
    if (tag == "<xmlattr>" || tag == "<xmlcomment>") continue;
    const std::string cls = attr(child, "class");
    RankRowSeen* here = row;
    if (tag == "g" && cls == "rank") here = &seen.rows[std::stoi(attr(child, "data-pid"))];
    if (tag == "g" && cls == "collective" && row) {
      row->collective_kinds.push_back(attr(child, "data-kind"));
      row->collective_x.push_back(child.get<double>("rect.<xmlattr>.x"));
    }
    if (tag == "g" && cls == "op" && row) ++row->ops;
    if (tag == "g" && cls == "scope" && row) row->scopes.push_back(child.get<std::string>("title"));
    if (tag == "line" && cls == "sync") ++seen.sync_lines;
    if (tag == "g" && cls == "legend") seen.legend.push_back(child.get<std::string>("text"));
    walk_timeline(child, seen, here);
  }
}

TimelineSeen parse_timeline(const std::string& svg) {
  std::stringstream in(svg);
  pt::ptree tree;
  pt::read_xml(in, tree);
  TimelineSeen seen;
  walk_timeline(tree, seen, nullptr);
  return seen;
}

/// The trace of one sharded program on 4 thread ranks (a 2x2 mesh): a
/// matmul that moves data, a redistribution, and collectives on both mesh
/// dims, so calls on different groups interleave, and a collective that
/// rank 0 reaches late. Rank 0's copy of the file.
std::string traced_program() {
  std::string text;
  std::mutex mu;
  testing::run_ranks(4, [&](Communicator& world) {
    const DeviceMesh mesh(world, {2, 2});
    const auto path = std::filesystem::temp_directory_path() / fmt::format("dtensor_timeline_{}.json", ::getpid());
    {
      TraceScope trace(mesh, path.string());
      const DTensor a = distribute_tensor(Tensor::randn({8, 6}, DType::Float32, 1), mesh, Layout::parse("S(0),S(1)"));
      const DTensor b = distribute_tensor(Tensor::randn({6, 4}, DType::Float32, 2), mesh, Layout::parse("R,S(0)"));
      const DTensor c = [&] {
        const CommScope forward("forward");  // a region: drawn in the scopes lane
        return matmul(a, b).redistribute(Layout::parse("R,R"));
      }();
      // Rank 0 alone does more local work first: the others wait for it at
      // the next collective.
      DTensor d = distribute_tensor(Tensor::randn({4, 4}, DType::Float32, 3), mesh, Layout::parse("S(0),S(1)"));
      if (world.rank() == 0)
        for (int i = 0; i < 5; ++i) d = add(d, d);
      (void)d.redistribute(Layout::parse("R,R"));
      (void)sum(c).redistribute(Layout::parse("R,R"));
      trace.finish();
    }
    if (world.rank() == 0) {
      std::ifstream in(path);
      std::lock_guard lock(mu);
      text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      std::filesystem::remove(path);
    }
  });
  return text;
}

BOOST_AUTO_TEST_SUITE(timeline_pictures)

// Every op and collective of every rank is drawn, collectives by kind; on
// the logical clock each call of a collective starts at the same x on all
// its ranks, and the picture is the same for a second run of the program.
BOOST_AUTO_TEST_CASE(every_event_is_drawn_and_calls_line_up) {
  const std::string text = traced_program();
  const nlohmann::json trace = nlohmann::json::parse(text);
  std::map<int, std::vector<nlohmann::json>> collectives;
  std::map<int, int> ops;
  std::map<int, std::vector<std::string>> scopes;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    if (e["cat"] == "collective")
      collectives[e["pid"].get<int>()].push_back(e);
    else if (e["cat"] == "scope")
      scopes[e["pid"].get<int>()].push_back(e["name"]);
    else
      ++ops[e["pid"].get<int>()];
  }
  const std::string svg = pictures::timeline_svg(text);
  const TimelineSeen seen = parse_timeline(svg);
  BOOST_TEST_REQUIRE(seen.rows.size() == 4u);
  std::map<std::string, std::map<int, std::vector<double>>> x_by_group;  // group: pid: x of its calls in order
  int calls_on_groups = 0;
  for (const auto& [pid, row] : seen.rows) {
    BOOST_TEST(row.ops == ops[pid], "rank " << pid);
    BOOST_TEST(row.scopes == scopes[pid], "rank " << pid);
    BOOST_TEST(row.scopes == std::vector<std::string>{"forward"}, "rank " << pid);
    BOOST_TEST_REQUIRE(row.collective_kinds.size() == collectives[pid].size(), "rank " << pid);
    for (std::size_t k = 0; k < row.collective_kinds.size(); ++k) {
      const auto& e = collectives[pid][k];
      BOOST_TEST(row.collective_kinds[k] == e["name"].get<std::string>(), "rank " << pid << " call " << k);
      BOOST_TEST_REQUIRE(e["args"].contains("ranks"), e.dump());
      const std::string group = fmt::format("{} {}", e["args"]["group"].get<std::string>(), e["args"]["ranks"].dump());
      x_by_group[group][pid].push_back(row.collective_x[k]);
      if (e["args"]["ranks"].size() > 1 && pid == e["args"]["ranks"][0].get<int>()) ++calls_on_groups;
    }
  }
  BOOST_TEST(x_by_group.size() >= 3u, "the program should use groups of both mesh dims");
  for (const auto& [group, by_pid] : x_by_group)
    for (const auto& [pid, xs] : by_pid)
      BOOST_TEST((xs == by_pid.begin()->second), group << ": rank " << pid << "'s calls start elsewhere");
  BOOST_TEST(seen.sync_lines == calls_on_groups);
  // The legend gives each kind's calls on the rank that made the most.
  std::map<std::string, std::size_t> most;
  for (const auto& [pid, row] : seen.rows) {
    std::map<std::string, std::size_t> mine;
    for (const auto& kind : row.collective_kinds) ++mine[kind];
    for (const auto& [kind, n] : mine) most[kind] = std::max(most[kind], n);
  }
  std::vector<std::string> legend;
  for (const auto& [kind, n] : most) legend.push_back(fmt::format("{} x{}", kind, n));
  BOOST_TEST(seen.legend == legend,
             fmt::format("{} against {}", fmt::join(seen.legend, "; "), fmt::join(legend, "; ")));
  // Logical time does not depend on the run's timing.
  BOOST_TEST(pictures::timeline_svg(traced_program()) == svg);
  pictures::TimelineOptions measured;
  measured.clock = pictures::TimelineClock::Measured;
  BOOST_TEST(parse_timeline(pictures::timeline_svg(text, measured)).rows.at(0).ops == ops[0]);
}

// A trace cut short (a rank that never reached a call its peers made) still
// draws, the call on the ranks that made it; bad input is a typed error.
BOOST_AUTO_TEST_CASE(unmatched_calls_and_bad_traces) {
  const std::string cut = R"({"traceEvents": [
    {"name": "process_name", "ph": "M", "ts": 0, "pid": 0, "tid": 0, "args": {"name": "rank 0"}},
    {"name": "add", "cat": "op", "ph": "X", "ts": 1, "dur": 5, "pid": 0, "tid": 1, "args": {}},
    {"name": "all_reduce", "cat": "collective", "ph": "X", "ts": 2, "dur": 1, "pid": 0, "tid": 2,
     "args": {"group": "g", "ranks": [0, 1], "bytes": 8}},
    {"name": "all_gather", "cat": "collective", "ph": "X", "ts": 9, "dur": 1, "pid": 1, "tid": 2,
     "args": {"group": "g", "ranks": [0, 1], "bytes": 8}}]})";
  const TimelineSeen seen = parse_timeline(pictures::timeline_svg(cut));
  BOOST_TEST(seen.rows.at(0).collective_kinds == std::vector<std::string>{"all_reduce"});
  BOOST_TEST(seen.rows.at(1).collective_kinds == std::vector<std::string>{"all_gather"});
  BOOST_CHECK_THROW(pictures::timeline_svg("not json"), ValueError);
  BOOST_CHECK_THROW(pictures::timeline_svg(R"({"events": []})"), ValueError);
  BOOST_CHECK_THROW(pictures::timeline_svg(R"({"traceEvents": [{"ph": "X", "pid": 0}]})"), ValueError);
  // Fields of the wrong type are ValueErrors too, never a crash or a wrong
  // conversion: a name that is not a string, ranks that are not integers.
  for (const char* bad : {
           R"({"traceEvents": [{"ph": "X", "pid": 0, "ts": 0, "dur": 1, "name": 5}]})",
           R"({"traceEvents": [{"ph": "X", "pid": 0, "ts": 0, "dur": 1, "cat": "collective",
                                 "args": {"ranks": [1e20]}}]})",
           R"({"traceEvents": [{"ph": "X", "pid": 0, "ts": 0, "dur": 1, "cat": "collective",
                                 "args": {"ranks": 3}}]})",
           R"({"traceEvents": [{"ph": "X", "pid": 1e12, "ts": 0, "dur": 1}]})",
           R"({"traceEvents": [{"ph": "M", "pid": 0, "name": "process_name", "args": []}]})"})
    BOOST_CHECK_THROW(pictures::timeline_svg(bad), ValueError);
  // A process name event without args draws; odd names and huge byte counts
  // stay readable XML.
  const std::string odd = R"({"traceEvents": [
    {"ph": "M", "pid": 0, "name": "process_name"},
    {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": ")" "r\\u0001 <1>" R"("}},
    {"name": "x\"/><b>", "cat": "collective", "ph": "X", "ts": 1, "dur": 1, "pid": 1, "tid": 2,
     "args": {"bytes": 1e30, "ranks": [1]}}]})";
  const TimelineSeen odd_seen = parse_timeline(pictures::timeline_svg(odd));
  BOOST_TEST(odd_seen.rows.size() == 2u);
  BOOST_TEST(odd_seen.rows.at(1).collective_kinds == std::vector<std::string>{"x\"/><b>"});
  pictures::TimelineOptions zero;
  zero.width = 0;
  BOOST_CHECK_THROW(pictures::timeline_svg(cut, zero), ValueError);
  try {
    (void)pictures::timeline_svg("not json");
  } catch (const ValueError& e) {
    BOOST_TEST(std::string(e.what()).find("traceEvents") != std::string::npos, e.what());
  }
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace pictures_suite
