#pragma once
// The old name of dtensor/api/shape_ops.h (the shape ops and factories),
// kept so that existing includes compile; the Shape type is dtensor/core/shape.h.
#include "dtensor/api/shape_ops.h"  // IWYU pragma: export
