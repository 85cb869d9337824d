#pragma once
// What the one-rank MoE (moe.cpp) and the expert-parallel one
// (moe_parallel.cpp) share: the routing, the experts' GEMMs by row range,
// and the balancing losses from the routing's statistics.
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "dtensor/nn/moe.h"

namespace dtensor::nn::detail {

Tensor index_tensor(const std::vector<std::int64_t>& values);

/// One forward's routing of T = B * len tokens [T, D]: the router's logits
/// and probabilities [T, E], the plan (capacity per sequence of `len`
/// tokens), and each assignment's gate [T, k] (differentiable).
struct Routing {
  Tensor logits, probs, gates;
  DispatchPlan plan;
};
Routing route(const Tensor& flat, const Tensor& router, const MoEConfig& config, const std::vector<double>& bias,
              std::int64_t sequence_length);

/// Rows grouped by expert (counts[i] rows for the i-th of the stacked
/// experts, in order) through their MLPs: one GEMM pair per expert with
/// rows. `fc_w` [n, H, D], `fc_b` [n, H], `proj_w` [n, D, H], `proj_b`
/// [n, D]; without `with_proj_bias` the output bias is left out (a tensor-
/// parallel rank but the first: the Partial sum takes it once).
Tensor run_experts(const Tensor& rows, std::span<const std::int64_t> counts, const Tensor& fc_w, const Tensor& fc_b,
                   const Tensor& proj_w, const Tensor& proj_b, bool with_proj_bias);

/// This forward's routing statistics as one vector [2E + 2]: the routed
/// count per expert, the dropped count, the sum over tokens of each
/// expert's probability (differentiable), and the sum of the squared
/// logsumexp of the logits (0 without a z-loss). Summed over the ranks
/// that hold different tokens, they are the whole batch's.
Tensor routing_statistics(const Routing& routing, const MoEConfig& config);

/// The balancing losses of the whole batch's statistics over `tokens`
/// tokens, and the load they record.
struct Balancing {
  std::optional<Tensor> loss;  // Switch's and the z-loss, summed (none if neither is on)
  double aux_loss = 0, z_loss = 0;
  std::vector<std::int64_t> load;
  std::int64_t dropped = 0;
};
Balancing balancing(const Tensor& statistics, std::int64_t tokens, const MoEConfig& config);

/// Records a forward's load and losses in the layer's state (the load
/// also into the step's, while recording, for the bias update).
template <TensorOrDTensor X>
void record(MoEState<X>& state, const MoEConfig& config, const Balancing& balancing);

/// The layer on DTensors (moe_parallel.cpp): expert parallelism over the
/// mesh dim its expert weights are S(0) on, the experts' hidden features
/// split over the dim they are S(1) on (tp), the tokens split over the
/// dims x is S(0) on.
DTensor forward_parallel(const MoE<DTensor>& layer, const DTensor& x);

}  // namespace dtensor::nn::detail
