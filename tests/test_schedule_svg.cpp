// pictures::schedule_svg: a pipeline schedule's rows, boxes by kind, the
// bubble hatched and measured, and the errors (part of test_pictures).
#include <boost/property_tree/ptree.hpp>
#include <boost/property_tree/xml_parser.hpp>
#include <boost/test/unit_test.hpp>

#include <sstream>
#include <string>
#include <vector>

#include <dtensor/pictures/svg.h>

#include "checks.h"

namespace schedule_svg_suite {
using namespace dtensor;
namespace pt = boost::property_tree;

namespace {

pictures::ScheduleBox box(std::string label, std::string kind, double start, double end) {
  return {std::move(label), std::move(kind), start, end, {}};
}

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// Two ranks of a 2-stage GPipe with two microbatches at unit costs (B = 2):
// rank 0 idles from 2 to 4, rank 1 from 0 to 1 and from 7 to 8.
std::vector<pictures::ScheduleRow> gpipe_2x2() {
  return {{"rank 0",
           {box("0F0", "forward", 0, 1), box("0F1", "forward", 1, 2), box("0B0", "backward", 4, 6),
            box("0B1", "backward", 6, 8)}},
          {"rank 1",
           {box("1F0", "forward", 1, 2), box("1F1", "forward", 2, 3), box("1B0", "backward", 3, 5),
            box("1B1", "backward", 5, 7)}}};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(schedule_svg)

BOOST_AUTO_TEST_CASE(every_box_row_and_kind_is_drawn_and_the_bubble_measured) {
  const auto rows = gpipe_2x2();
  pictures::SchedulePictureOptions options;
  options.title = "gpipe: 2 ranks";
  const std::string svg = pictures::schedule_svg(rows, options);
  std::istringstream in(svg);
  pt::ptree tree;
  BOOST_REQUIRE_NO_THROW(pt::read_xml(in, tree));  // well-formed
  BOOST_TEST(count(svg, R"(class="box")") == 8);
  BOOST_TEST(count(svg, R"(data-kind="forward")") == 4);
  BOOST_TEST(count(svg, R"(data-kind="backward")") == 4);
  // Each rank named where a person sees it, not only in a hover.
  BOOST_TEST(count(svg, R"(class="name")") == 2);
  BOOST_TEST(svg.find(">rank 0</text>") != std::string::npos);
  BOOST_TEST(svg.find(">rank 1</text>") != std::string::npos);
  // Each box's label inside it, and its colour differs by kind.
  for (const char* label : {"0F0", "0F1", "0B0", "0B1", "1F0", "1F1", "1B0", "1B1"})
    BOOST_TEST(svg.find(std::string(">") + label + "</text>") != std::string::npos, label);
  BOOST_TEST(svg.find("#6fa8dc") != std::string::npos);
  BOOST_TEST(svg.find("#38761d") != std::string::npos);
  // Idle over the makespan of 8: rank 0 is idle 2, rank 1 idle 2.
  BOOST_TEST(count(svg, ">idle 25%</text>") == 2);
  BOOST_TEST(svg.find("idle (the bubble)") != std::string::npos);
  BOOST_TEST(svg.find("gpipe: 2 ranks") != std::string::npos);
  // The same input draws the same picture.
  BOOST_TEST(pictures::schedule_svg(rows, options) == svg);
}

BOOST_AUTO_TEST_CASE(overlapping_boxes_count_their_time_once) {
  // A row whose boxes overlap (two stages on one rank drawn from a measured
  // trace) is busy for the union of their spans: 0-3 of 4, idle 25%.
  const std::vector<pictures::ScheduleRow> rows{{"rank 0",
                                                 {box("0F0", "forward", 0, 2), box("1F0", "forward", 1, 3),
                                                  box("x", "weight_backward", 3, 3)}},
                                                {"rank 1", {box("1B0", "input_backward", 0, 4)}}};
  const std::string svg = pictures::schedule_svg(rows);
  BOOST_TEST(count(svg, ">idle 25%</text>") == 1);
  BOOST_TEST(count(svg, ">idle 0%</text>") == 1);
  BOOST_TEST(svg.find("input gradient (I)") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(bad_boxes_are_named) {
  const double nan = std::nan("");
  testing::check_throws<ValueError>(
      [&] {
        pictures::schedule_svg(std::vector<pictures::ScheduleRow>{{"rank 0", {box("0F0", "forward", 2, 1)}}});
      },
      "box '0F0' of row 'rank 0' runs from 2 to 1");
  testing::check_throws<ValueError>(
      [&] {
        pictures::schedule_svg(std::vector<pictures::ScheduleRow>{{"rank 3", {box("3B1", "backward", nan, 1)}}});
      },
      "box '3B1' of row 'rank 3'");
  testing::check_throws<ValueError>(
      [&] {
        pictures::schedule_svg(std::vector<pictures::ScheduleRow>{{"r", {}}});
      },
      "no boxes");
  pictures::SchedulePictureOptions wide;
  wide.width = -1;
  testing::check_throws<ValueError>([&] { pictures::schedule_svg(gpipe_2x2(), wide); }, "width -1");
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace schedule_svg_suite
