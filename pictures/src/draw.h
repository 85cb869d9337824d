#pragma once
// The pieces the layout and plan pictures share: a drawing is an SVG
// fragment with its size, placed into a document (or another drawing) with
// a translate.
#include <span>
#include <string>
#include <string_view>

#include "dtensor/pictures/svg.h"

namespace dtensor::pictures::detail {

struct Drawing {
  std::string body;  // SVG elements, coordinates from (0, 0)
  double width = 0;
  double height = 0;
};

/// The layout picture as a fragment; `title` heads it (the layout's text
/// form where empty). Validates the layout and options (LayoutError,
/// ValueError).
Drawing draw_layout(const Shape& mesh_shape, const Shape& global_shape, const Layout& layout,
                    const PictureOptions& options);

/// A whole SVG document around `drawing`, with the hatch patterns Partial
/// tiles fill with (url(#hatch-sum), ...) and a white background.
std::string svg_document(const Drawing& drawing);

/// "d1" or the mesh dim's name.
std::string mesh_dim_label(int mesh_dim, const PictureOptions& options);
/// The labels of these mesh dims, "tp,d1".
std::string mesh_dims_label(std::span<const int> mesh_dims, const PictureOptions& options);
/// What a step is and where it runs, "all_gather over tp" (its kind alone
/// where it names no mesh dim): the head of its text in every picture.
std::string step_label(const PlanStep& step, const PictureOptions& options);

}  // namespace dtensor::pictures::detail
