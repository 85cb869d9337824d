#pragma once
// Runs a plan on a mesh: the only place in redistribute/ that talks to a
// communicator, and only through the Communicator interface.
#include "dtensor/core/tensor.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/redistribute/plan.h"

namespace dtensor {

/// Turns this rank's local shard under plan.from into its local shard under
/// plan.to. Every rank of the mesh must call it with the same plan. Memory:
/// the result plus staging buffers no larger than a small multiple of the
/// larger of the two local shards.
Tensor execute_plan(const Plan& plan, const DeviceMesh& mesh, const Tensor& local);

}  // namespace dtensor
