#pragma once
// The umbrella header: everything a user of dtensor needs.
#include "dtensor/core/dtype.h"               // IWYU pragma: export
#include "dtensor/core/error.h"               // IWYU pragma: export
#include "dtensor/core/host_memory.h"         // IWYU pragma: export
#include "dtensor/core/placement.h"           // IWYU pragma: export
#include "dtensor/core/reduce_op.h"           // IWYU pragma: export
#include "dtensor/core/shape.h"               // IWYU pragma: export
#include "dtensor/core/tensor.h"              // IWYU pragma: export
#include "dtensor/core/units.h"               // IWYU pragma: export
#include "dtensor/mesh/communicator.h"        // IWYU pragma: export
#include "dtensor/mesh/device_mesh.h"         // IWYU pragma: export
#include "dtensor/mesh/threads.h"             // IWYU pragma: export
#include "dtensor/mesh/backends.h"            // IWYU pragma: export
#include "dtensor/mesh/launch.h"              // IWYU pragma: export
#include "dtensor/redistribute/cost_model.h"  // IWYU pragma: export
#include "dtensor/redistribute/executor.h"    // IWYU pragma: export
#include "dtensor/redistribute/plan.h"        // IWYU pragma: export
#include "dtensor/redistribute/planner.h"     // IWYU pragma: export
#include "dtensor/ops/dispatch.h"             // IWYU pragma: export
#include "dtensor/ops/op.h"                   // IWYU pragma: export
#include "dtensor/api/dtensor_tensor.h"       // IWYU pragma: export
#include "dtensor/api/functional.h"           // IWYU pragma: export
#include "dtensor/api/linalg.h"               // IWYU pragma: export
#include "dtensor/api/nn.h"                   // IWYU pragma: export
#include "dtensor/api/pointwise.h"            // IWYU pragma: export
#include "dtensor/api/reduction.h"            // IWYU pragma: export
#include "dtensor/api/shape.h"                // IWYU pragma: export
