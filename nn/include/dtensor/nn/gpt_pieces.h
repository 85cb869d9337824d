#pragma once
// The GPT's forward split at its block boundaries, so that the whole model
// (GPT::forward_with) and a pipeline stage holding only some of its pieces
// (pipeline_stage.h) run the same code before, between and after the blocks.
#include <cstdint>

#include "dtensor/nn/modules.h"

namespace dtensor::nn {

/// i64 tokens [B, T] at positions past.. -> the residual stream [B, T, D]:
/// token plus position embeddings, then the plan's layout (with a
/// vocab-parallel table the sum is Partial, reduced once for both).
template <TensorOrDTensor X>
X embed_tokens(const Embedding<X>& wte, const Embedding<X>& wpe, const X& tokens, std::int64_t past,
               const ActivationLayouts& layouts);

/// The residual stream [B, T, D] -> logits [B, T, vocab]: the final norm,
/// then the lm_head.
template <TensorOrDTensor X>
X head_logits(const LayerNorm<X>& ln_f, const Linear<X>& lm_head, const X& x, const ActivationLayouts& layouts);

/// Mean cross entropy of the next byte of logits [B, T, vocab] against i64
/// targets [B, T]: a 0-d tensor.
template <TensorOrDTensor X>
X next_byte_loss(const X& logits, const X& targets);

}  // namespace dtensor::nn
