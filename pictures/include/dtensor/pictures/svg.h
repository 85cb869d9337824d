#pragma once
// Pictures of layouts and of layout changes, as SVG a person looks at: which
// rank holds which box of a tensor, with Replicate drawn as stacked copies
// and Partial as hatched tiles marked with their reduction.
//
// The pictures are computed from metadata only (mesh shape, global shape,
// layout, plan): drawing a DTensor communicates nothing.
#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/api/dtensor_tensor.h"
#include "dtensor/core/placement.h"
#include "dtensor/core/shape.h"
#include "dtensor/ops/dispatch.h"
#include "dtensor/redistribute/plan.h"

namespace dtensor::pictures {

struct PictureOptions {
  /// Tensor dims drawn as the grid's rows and columns; -1 picks the last two
  /// (a 1-D tensor is one row). The other dims become small multiples: one
  /// panel per stretch of them that the same ranks hold.
  int row_dim = -1;
  int col_dim = -1;
  /// Names of the mesh dims for labels ("dp", "tp"); empty: "d0", "d1", ...
  std::vector<std::string> mesh_dim_names;
  /// Bytes per element, for the byte counts in hovers (default f32's).
  std::size_t itemsize = 4;
  /// Replaces the generated title where not empty.
  std::string title;
};

/// `text` with &, <, > and " escaped and control characters other than tab
/// and newlines (which XML cannot hold) replaced by '?', for SVG and HTML
/// text and attributes (every picture dtensor draws, the loss plot of
/// train_gpt included).
std::string xml_escape(std::string_view text);

/// The layout of a tensor of `global_shape` on a mesh of `mesh_shape`: one
/// rectangle per distinct box, sized in proportion to its elements, coloured
/// by the holder's coordinate (hue along the first sharding mesh dim,
/// lightness along the second), labelled with rank and coordinate; copies
/// on Replicate mesh dims stacked with a count, Partial boxes hatched and
/// marked with the reduction and the mesh dims it is pending over, empty
/// shards listed as such, nested shard orders spelled out. LayoutError where
/// the layout does not fit the mesh and shape; ValueError for bad options.
std::string layout_svg(const Shape& mesh_shape, const Shape& global_shape, const Layout& layout,
                       const PictureOptions& options = {});

/// The layout of `tensor`, with its dtype's size and, unless the options
/// name them, its mesh's dim names.
std::string to_svg(const DTensor& tensor, PictureOptions options = {});

/// A layout change step by step: the source layout, then one panel per step
/// with the layout after it, joined by arrows labelled with the collective,
/// its mesh dims and the bytes the busiest rank receives; the caption gives
/// the number of steps and collectives, the busiest rank's bytes and the
/// planner's estimated time, and under it the runner-up's (runner_up_text).
std::string plan_svg(const Plan& plan, const PictureOptions& options = {});

/// "runner-up: all_gather+all_to_all, 1.5 KiB to the busiest rank,
/// estimated 4.1 us": the cheapest plan the planner compared and did not
/// choose, priced by the same cost model; empty when the plan has none.
std::string runner_up_text(const Plan& plan);

/// An op's decision as explain mode saw it: each input as called, the
/// layout the chosen strategy needs it in (with the plan's collectives on
/// the arrow between), and the output; the caption gives the chosen cost
/// against the runner-up's.
std::string decision_svg(const ExplainedOp& op, const PictureOptions& options = {});

/// While alive on this thread, every dispatched op's decision is drawn with
/// decision_svg and kept in call order (explain mode's text lines go to
/// `sink`, nowhere by default). Nested ExplainScopes still see the text.
class ExplainPictures {
 public:
  explicit ExplainPictures(PictureOptions options = {}, std::function<void(const std::string&)> sink = {});
  const std::vector<std::string>& svgs() const { return svgs_; }

 private:
  PictureOptions options_;
  std::vector<std::string> svgs_;
  ExplainScope scope_;
};

/// One self-contained HTML page (nothing fetched: styles, script and
/// pictures inline) of a layout change: the plan picture, each step with
/// the planner's reason, and a hover over any tile that shows its ranks,
/// mesh coordinates, offsets, sizes and bytes beside the picture.
std::string plan_html(const Plan& plan, const PictureOptions& options = {});

/// How a timeline picture places events along its time axis.
enum class TimelineClock {
  /// Each op one unit, each collective three, and a collective starting on
  /// all its ranks when the last of them reaches it: order and waiting, the
  /// same picture on every run of the same program.
  Logical,
  /// The times the trace recorded.
  Measured,
};

struct TimelineOptions {
  TimelineClock clock = TimelineClock::Logical;
  /// Pixels the time axis spans.
  double width = 900;
  /// Replaces "timeline of N rank(s)" where not empty.
  std::string title;
};

/// A Chrome trace as TraceScope or DTENSOR_TRACE write it (the file's text),
/// drawn as one row per rank with an ops lane (nested ops inset) and a
/// collectives lane coloured by kind, each box's details in its hover, a
/// dashed line through each collective call across its ranks (logical
/// clock), and a legend with each kind's count. ValueError naming what is
/// wrong where the text is not such a trace.
std::string timeline_svg(std::string_view trace_json, const TimelineOptions& options = {});

/// One box of a schedule picture: what a row runs from `start` to `end`.
struct ScheduleBox {
  std::string label;  // drawn inside where it fits ("0F3")
  /// Its colour and class: "forward", "backward", "input_backward",
  /// "weight_backward"; any other kind is drawn grey under its own name.
  std::string kind;
  double start = 0, end = 0;
  std::string tooltip;  // the hover (the label where empty)
};

/// One row: a rank's boxes, in any order.
struct ScheduleRow {
  std::string name;  // drawn at the row's left ("rank 0")
  std::vector<ScheduleBox> boxes;
};

struct SchedulePictureOptions {
  double width = 900;  // pixels the time axis spans
  std::string title;
  /// The text under the title, e.g. how time is measured.
  std::string subtitle;
};

/// A schedule as a picture (a pipeline's, from its simulation or a measured
/// step): one row per rank, named where a person sees it, each box coloured
/// by kind with its label inside where it fits and its details in a hover;
/// the idle time in each row (the bubble) hatched, with the row's idle share
/// at its right; a legend of the kinds. ValueError naming the box where a
/// start or end is not finite or ends before it starts, or where there is
/// nothing to draw.
std::string schedule_svg(std::span<const ScheduleRow> rows, const SchedulePictureOptions& options = {});

}  // namespace dtensor::pictures
