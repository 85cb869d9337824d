#pragma once
// A GPT cut into pipeline stages: stage s holds a contiguous range of the
// blocks; the first stage also the embeddings, the last the final norm, the
// lm_head and the loss. The runtime (pipeline_runtime.h) moves the residual
// stream between them.
//
//   auto split = nn::pipeline::split_layers(/*layers=*/4, /*stages=*/2);   // blocks 0-1, 2-3
//   auto stage = nn::pipeline::GPTStage<Tensor>::take(std::move(whole), split, /*stage=*/1);
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "dtensor/nn/modules.h"

namespace dtensor::nn::pipeline {

/// How many blocks each stage holds, in stage order.
struct LayerSplit {
  std::vector<std::int64_t> blocks_per_stage;

  int stages() const { return static_cast<int>(blocks_per_stage.size()); }
  std::int64_t first_block(int stage) const;
  std::int64_t blocks(int stage) const { return blocks_per_stage.at(static_cast<std::size_t>(stage)); }
};

/// `counts` as given (one per stage, each at least 1, summing to `layers`),
/// or when empty an even split (the first layers % stages stages one block
/// more). A ValueError names the values and the rule otherwise.
LayerSplit split_layers(std::int64_t layers, int stages, std::span<const std::int64_t> counts = {});

/// A new leaf requiring a gradient, with the values (a copy, not shared
/// storage) and the layout of `p`: a tied weight's second copy.
Tensor leaf_copy(const Tensor& p);
DTensor leaf_copy(const DTensor& p);

/// One stage of a GPT, holding only its own pieces.
template <TensorOrDTensor X>
struct GPTStage {
  int stage = 0, stages = 1;
  std::int64_t first_block = 0;  // the whole model's index of blocks[0]
  GPTConfig config;
  std::optional<Embedding<X>> wte, wpe;  // the first stage's
  std::vector<Block<X>> blocks;
  std::optional<LayerNorm<X>> ln_f;  // the last stage's
  std::optional<Linear<X>> lm_head;  // the last stage's
  ActivationLayouts layouts;
  /// FSDP beside pp (FSDP2's per-parameter sharding, see
  /// ParallelPlan::shards_per_parameter; DTensor only): when not empty,
  /// block i's parameters are shards gathered to gathered_layouts[i] for the
  /// block (again by its backward), and the stage's others (embeddings,
  /// final norm, lm_head, in named_parameters() order) to
  /// root_gathered_layouts once per forward.
  std::vector<std::vector<Layout>> gathered_layouts;
  std::vector<Layout> root_gathered_layouts;

  bool is_first() const { return stage == 0; }
  bool is_last() const { return stage == stages - 1; }
  /// A tied model (GPTConfig::tie_embeddings) cut into several stages: the
  /// last stage's lm_head holds its own copy of the token embedding's
  /// weight, listed as "wte.weight" too, whose gradient
  /// sum_tied_gradients (pipeline_runtime.h) adds to the first stage's.
  bool holds_tied_copy() const { return config.tie_embeddings && is_last() && !is_first(); }
  /// The last stage's lm_head as the forward uses it.
  Linear<X> head() const;

  /// Moves stage `stage`'s pieces out of `whole` (built whole so that every
  /// parameter has the one-rank model's values, whatever the split).
  static GPTStage take(GPT<X>& whole, const LayerSplit& split, int stage);

  /// The first stage: i64 tokens [B, T] in; the others: the residual stream
  /// [B, T, D]. Out: the residual stream, or on the last stage the logits.
  X forward(const X& input) const;
  /// The same for generation: `input` holds the positions after the ones
  /// `cache` (this stage's own, for its blocks) holds, which it extends.
  X forward(const X& input, KVCache<X>& cache) const;
  /// The loss of the last stage's logits (next_byte_loss).
  X loss(const X& logits, const X& targets) const;

  /// Under the whole model's names ("blocks.<global index>.", "wte.", ...),
  /// in the whole model's order. A tied copy is listed as "wte.weight": the
  /// first and last stages then both hold that name.
  NamedParameters<X> named_parameters();
  std::vector<X> parameters();
};

extern template struct GPTStage<Tensor>;
extern template struct GPTStage<DTensor>;

}  // namespace dtensor::nn::pipeline
