// A GPT's pieces by stage, and the split of its blocks.
#include "dtensor/nn/pipeline_stage.h"

#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtensor/core/error.h"
#include "dtensor/nn/gpt_pieces.h"

namespace dtensor::nn::pipeline {

std::int64_t LayerSplit::first_block(int stage) const {
  return std::accumulate(blocks_per_stage.begin(), blocks_per_stage.begin() + stage, std::int64_t{0});
}

LayerSplit split_layers(std::int64_t layers, int stages, std::span<const std::int64_t> counts) {
  if (stages < 1) throw ValueError(fmt::format("[pipeline] {} stages; expected at least 1", stages));
  if (counts.empty()) {
    if (layers < stages)
      throw ValueError(
          fmt::format("[pipeline] {} layers over {} stages; every stage needs at least one block", layers, stages));
    LayerSplit out;
    for (int s = 0; s < stages; ++s) out.blocks_per_stage.push_back(layers / stages + (s < layers % stages ? 1 : 0));
    return out;
  }
  const std::int64_t total = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
  const bool each_positive = std::all_of(counts.begin(), counts.end(), [](std::int64_t c) { return c >= 1; });
  if (static_cast<int>(counts.size()) != stages || total != layers || !each_positive)
    throw ValueError(
        fmt::format("[pipeline] layer split {} over {} stages and {} layers; expected one count per stage, each at "
                    "least 1, "
                    "summing to the layers",
                    fmt::join(counts, ","), stages, layers));
  return LayerSplit{{counts.begin(), counts.end()}};
}

Tensor leaf_copy(const Tensor& p) {
  Tensor out = p.detach().clone();
  out.requires_grad_();
  return out;
}
DTensor leaf_copy(const DTensor& p) {
  DTensor out = DTensor::from_local(p.detach().to_local().clone(), p.mesh(), p.placements(), p.shape(),
                                    FromLocalCheck::Trust);
  out.requires_grad_();
  return out;
}

template <TensorOrDTensor X>
GPTStage<X> GPTStage<X>::take(GPT<X>& whole, const LayerSplit& split, int stage) {
  if (stage < 0 || stage >= split.stages())
    throw ValueError(fmt::format("[pipeline] stage {} of a {}-stage split", stage, split.stages()));
  if (static_cast<std::int64_t>(whole.blocks.size()) != split.first_block(split.stages()))
    throw ValueError(fmt::format("[pipeline] a split of {} blocks for a model of {}", split.first_block(split.stages()),
                                 whole.blocks.size()));
  GPTStage out;
  out.stage = stage;
  out.stages = split.stages();
  out.first_block = split.first_block(stage);
  out.config = whole.config;
  out.layouts = whole.layouts;
  const auto first = whole.blocks.begin() + out.first_block;
  out.blocks.assign(std::make_move_iterator(first), std::make_move_iterator(first + split.blocks(stage)));
  if (out.is_first()) {
    out.wte = std::move(whole.wte);
    out.wpe = std::move(whole.wpe);
  }
  if (out.is_last()) {
    out.ln_f = std::move(whole.ln_f);
    out.lm_head = std::move(whole.lm_head);
    // Tied across stages: the last stage's own copy of the token
    // embedding's weight (the first stage's is on another rank, or is
    // another stage's leaf); sum_tied_gradients keeps the two equal.
    if (out.holds_tied_copy()) out.lm_head->weight = leaf_copy(out.lm_head->weight);
  }
  return out;
}

template <TensorOrDTensor X>
Linear<X> GPTStage<X>::head() const {
  // One stage holding both ends of a tied model: the embedding's weight
  // itself, read now (a load by name replaces it, not a copy).
  return config.tie_embeddings && is_first() ? Linear<X>{wte->weight, std::nullopt} : *lm_head;
}

namespace {
// The stage's forward, with or without a cache; under per-parameter FSDP
// the stage's root parameters gathered once and each block's for it.
template <TensorOrDTensor X>
X run_stage(const GPTStage<X>& stage, const X& input, KVCache<X>* cache) {
  // Under FSDP a copy of the stage (handles) whose root parameters are
  // replaced by their gathered values; otherwise the stage itself.
  std::optional<GPTStage<X>> gathered_root;
  if constexpr (std::same_as<X, DTensor>)
    if (!stage.root_gathered_layouts.empty()) {
      gathered_root = stage;
      NamedParameters<DTensor> root;
      for (const auto& member : gathered_root->named_parameters())
        if (!member.first.starts_with("blocks.")) root.push_back(member);
      detail::gather_parameters(root, stage.root_gathered_layouts, "stage root");
    }
  const GPTStage<X>& used = gathered_root ? *gathered_root : stage;
  const std::int64_t past = cache ? cache->length : 0;
  X x = used.is_first() ? embed_tokens(*used.wte, *used.wpe, input, past, used.layouts) : input;
  for (std::size_t l = 0; l < used.blocks.size(); ++l) {
    if constexpr (std::same_as<X, DTensor>)
      if (!stage.gathered_layouts.empty()) {
        x = detail::gathered_block(stage.blocks[l], stage.gathered_layouts.at(l), x, used.layouts, cache, l);
        continue;
      }
    x = used.blocks[l](x, used.layouts, cache, l);
  }
  if (cache) cache->length += input.shape()[1];
  return used.is_last() ? head_logits(*used.ln_f, used.head(), x, used.layouts) : x;
}
}  // namespace

template <TensorOrDTensor X>
X GPTStage<X>::forward(const X& input) const {
  return run_stage<X>(*this, input, nullptr);
}

template <TensorOrDTensor X>
X GPTStage<X>::forward(const X& input, KVCache<X>& cache) const {
  const std::int64_t len = input.shape()[1];
  if (cache.length + len > config.seq)
    throw ShapeError(fmt::format("[pipeline] stage {}: positions up to {}; the model has {} (seq)", stage,
                                 cache.length + len, config.seq));
  if (cache.keys.empty()) {
    cache.keys.resize(blocks.size());
    cache.values.resize(blocks.size());
  }
  return run_stage<X>(*this, input, &cache);
}

template <TensorOrDTensor X>
X GPTStage<X>::loss(const X& logits, const X& targets) const {
  return next_byte_loss(logits, targets);
}

template <TensorOrDTensor X>
NamedParameters<X> GPTStage<X>::named_parameters() {
  NamedParameters<X> out;
  if (wte) {
    wte->named_parameters("wte.", out);
    wpe->named_parameters("wpe.", out);
  }
  for (std::size_t l = 0; l < blocks.size(); ++l)
    blocks[l].named_parameters(fmt::format("blocks.{}.", first_block + static_cast<std::int64_t>(l)), out);
  if (ln_f) {
    ln_f->named_parameters("ln_f.", out);
    if (!config.tie_embeddings)
      lm_head->named_parameters("lm_head.", out);
    else if (holds_tied_copy())
      out.emplace_back("wte.weight", &lm_head->weight);  // the copy, under the one weight's name
  }
  return out;
}

template <TensorOrDTensor X>
std::vector<X> GPTStage<X>::parameters() {
  std::vector<X> out;
  for (auto& [name, p] : named_parameters()) out.push_back(*p);
  return out;
}

template struct GPTStage<Tensor>;
template struct GPTStage<DTensor>;

}  // namespace dtensor::nn::pipeline
