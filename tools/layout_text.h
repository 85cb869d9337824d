#pragma once
// Layouts as text, for dtensor-plan and dtensor-ckpt: which rank holds which
// block of a tensor, drawn in ASCII for a person learning sharding (the SVG
// pictures are dtensor/pictures/svg.h's).
#include <cstdint>
#include <string>

#include "dtensor/core/placement.h"
#include "dtensor/core/shape.h"

namespace dtensor::cli {

/// "64x128", "10-element", "scalar".
std::string shape_text(const Shape& shape);
/// One line per mesh dim saying what its placement does, e.g.
/// "mesh dim 1 (4 ranks): S(1) splits tensor dim 1 into 4 chunks".
std::string explain_placements(const Shape& mesh_shape, const Shape& global_shape, const Layout& layout,
                               const std::string& indent);

/// Where the blocks of the tensor live under `layout`: an ASCII grid of the
/// tensor (1-D and 2-D) with each block labelled by the lowest rank holding
/// it, a legend for replicated and partial blocks, and a per-rank table of
/// boxes for tensors of other ranks (or grids too dense to draw). `layout`
/// must be validated against the mesh and shape. Every line starts with
/// `indent` and ends with '\n'.
std::string layout_text(const Shape& mesh_shape, const Shape& global_shape, std::size_t itemsize, const Layout& layout,
                        const std::string& indent);

}  // namespace dtensor::cli
