#pragma once
// Mixture of experts: a router picks k of E expert MLPs for each token, the
// tokens travel to their experts grouped by expert (dispatch), each expert
// runs one GEMM pair over its rows, and the results travel back, weighted
// by the router's probabilities (combine).
//
//   nn::GPTConfig config{.layers = 2, .d_model = 64, .heads = 4};
//   config.moe = {.experts = 8, .top_k = 2};          // every block's MLP becomes an MoE
//   auto model = nn::GPT<Tensor>::init(config, seed, nn::plain_parameters(DType::Float32));
//   Tensor loss = model.loss(tokens, targets);         // next-byte loss + the balancing losses
//
// Who goes where is a pure function of the routing (plan_dispatch: counts,
// the permutation, what was dropped), and moving the rows is two ops
// (moe_dispatch, moe_combine), each the other's backward through autograd.
// On DTensors the same layer runs expert-parallel (the ep plan: expert
// weights S(0) over an ep mesh dim, the rows by all_to_allv; moe_parallel.cpp).
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/api/functional.h"

namespace dtensor::nn {

/// Which assignments an expert over capacity drops: the lowest router
/// probabilities first, or the latest tokens first (Megatron's "probs" and
/// "position").
enum class DropPolicy : std::uint8_t { Probs, Position };
/// How the load is balanced: the Switch auxiliary loss, or DeepSeek-V3's
/// auxiliary-loss-free per-expert bias on the selection.
enum class Balance : std::uint8_t { AuxLoss, Bias };

struct MoEConfig {
  std::int64_t experts = 0;  // E; 0: dense MLPs
  std::int64_t top_k = 2;    // k, 1 or 2
  /// Blocks l with (l + 1) % every == 0 are MoE (1: all; 2: every second).
  std::int64_t every = 1;
  /// Capacity C = ceil(T k / E * factor) rows per expert and sequence of T
  /// tokens, the rest dropped; none: dropless.
  std::optional<double> capacity_factor{};
  DropPolicy drop_policy = DropPolicy::Probs;
  /// The chosen k probabilities divided by their sum (Mixtral), or as the
  /// softmax gave them (Switch, GShard).
  bool renormalize = false;
  Balance balance = Balance::AuxLoss;
  double aux_loss = 0.01;  // alpha of alpha * E * sum_i f_i P_i (Balance::AuxLoss)
  double z_loss = 0;       // coefficient of mean(logsumexp(logits)^2)
  double bias_rate = 1e-3;  // Balance::Bias: b_i += rate * sign(mean load - load_i) after each step

  bool enabled() const { return experts > 0; }
  bool in_block(std::int64_t layer) const { return enabled() && (layer + 1) % every == 0; }
  /// ValueError naming the value: k outside {1, 2} or above E, every < 1, a
  /// capacity factor not positive, negative coefficients.
  void check() const;
};

/// ceil(tokens * top_k / experts * factor), at least 1.
std::int64_t expert_capacity(std::int64_t tokens, std::int64_t top_k, std::int64_t experts, double factor);

/// Where each of T tokens' k assignments goes: rows grouped by expert
/// (expert 0's first), tokens in order within an expert.
struct DispatchPlan {
  std::int64_t tokens = 0, top_k = 1, experts = 0;
  std::vector<std::int64_t> routed;  // per expert: assignments routed to it, before drops
  std::vector<std::int64_t> counts;  // per expert: rows it processes (routed less dropped)
  std::vector<std::int64_t> token_of_row;
  /// Per assignment t * k + j: its row, or rows() where it was dropped.
  std::vector<std::int64_t> row_of_assignment;
  std::int64_t dropped = 0;

  std::int64_t rows() const { return static_cast<std::int64_t>(token_of_row.size()); }
};

/// The plan of `expert_ids` (T * k, token-major: token t's j-th choice at
/// t * k + j, each in [0, E)), `probabilities` (the same layout: each
/// choice's router probability, which DropPolicy::Probs ranks by), and a
/// capacity (none: dropless) per expert and group of `group_tokens`
/// consecutive tokens (0: all T are one group). The model's groups are its
/// sequences (GShard's groups), so that a sequence's drops are the same on
/// every mesh: Megatron's capacity over each rank's tokens changes with the
/// layout. ValueError naming the value for an id outside [0, E), sizes that
/// disagree, a token choosing one expert twice, or groups that do not
/// divide T.
DispatchPlan plan_dispatch(std::span<const std::int64_t> expert_ids, std::span<const double> probabilities,
                           std::int64_t top_k, std::int64_t experts, std::optional<std::int64_t> capacity,
                           DropPolicy policy, std::int64_t group_tokens = 0);

/// x [T, D] -> the plan's rows [rows, D] (a gather; its backward adds each
/// row's gradient into its token's).
template <TensorOrDTensor X>
X moe_dispatch(const X& x, const DispatchPlan& plan);
/// Expert outputs y [rows, D] and gates [T, k] -> [T, D]: each token's sum
/// over its kept assignments of gate * row (a dropped one adds nothing).
template <TensorOrDTensor X>
X moe_combine(const X& y, const X& gates, const DispatchPlan& plan);

/// What an MoE layer routed: the last forward's plan statistics, the load
/// summed since the last bias update (Balance::Bias), the balancing losses
/// of the last forward (value and, while recording, the tensor the model's
/// loss adds), and the selection bias.
template <TensorOrDTensor X>
struct MoEState {
  std::vector<std::int64_t> last_load;  // routed per expert, the last forward
  std::int64_t last_dropped = 0;
  std::vector<std::int64_t> step_load;  // routed per expert since end_step, in recorded forwards
  std::int64_t step_dropped = 0;        // the same for the dropped
  std::vector<double> bias;             // Balance::Bias: added to the probabilities to choose
  double aux_loss = 0, z_loss = 0;      // the last forward's
  /// Under ep, this rank's last forward: the rows it sent to each ep peer
  /// (its own included) and received from each (empty off ep).
  std::vector<std::int64_t> sent_rows, received_rows;
  std::optional<X> pending_loss;        // taken by the model's loss
};

/// The layer: a router [E, D] (no bias), E expert MLPs D -> 4D -> D (GELU)
/// stored as one tensor per matrix with the expert first, so that they
/// shard on dim 0, and the state above (shared by the layer's copies).
template <TensorOrDTensor X>
struct MoE {
  X router;                     // [E, D]
  X fc_weight, fc_bias;         // [E, 4D, D], [E, 4D]
  X proj_weight, proj_bias;     // [E, D, 4D], [E, D]
  MoEConfig config;
  std::shared_ptr<MoEState<X>> state = std::make_shared<MoEState<X>>();

  /// x [B, T, D] -> [B, T, D]. Records the routing and the balancing loss
  /// (state). On DTensors the layouts say the parallelism: the experts S(0)
  /// over an ep mesh dim (their rows travel by all_to_allv; x must be S(0)
  /// there too), S(1) of fc / S(2) of proj over a tp dim (the output is then
  /// Partial over tp, as a row-parallel projection's), x S(0) or R
  /// elsewhere; LayoutError naming the tensor otherwise, ValueError when E
  /// does not divide by ep.
  X operator()(const X& x) const;
  void named_parameters(const std::string& prefix, std::vector<std::pair<std::string, X*>>& out);
  /// After each optimizer step: under Balance::Bias, b_i += rate *
  /// sign(mean - load_i) over the step's load; then the step's counts start
  /// again.
  void end_step();
};

extern template struct MoE<Tensor>;
extern template struct MoE<DTensor>;

}  // namespace dtensor::nn
