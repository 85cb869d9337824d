// The module layer's forward passes, once for Tensor and DTensor alike.
#include "dtensor/nn/modules.h"

#include "dtensor/nn/gpt_pieces.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "dtensor/api/linalg.h"
#include "dtensor/api/embedding.h"
#include "dtensor/api/pointwise.h"
#include "dtensor/api/reduction.h"
#include "dtensor/api/shape_ops.h"
#include "dtensor/core/error.h"

namespace dtensor::nn {

Tensor at_point(const Tensor& x, const ActivationLayouts&, Point) { return x; }
DTensor at_point(const DTensor& x, const ActivationLayouts& layouts, Point p) {
  const auto& want = layouts[p];
  if (!want || x.placements() == *want) return x;
  return x.redistribute(*want);
}

namespace {

// A module's parameters from its children's, in the order given: each
// child's names under prefix + its name (children_parameters(prefix, out,
// "q.", q, "k.", k) gives "<prefix>q.weight", ..., "<prefix>k.weight", ...).
template <TensorOrDTensor X, class Child, class... Rest>
void children_parameters(const std::string& prefix, NamedParameters<X>& out, const char* name, Child& child,
                         Rest&... rest) {
  child.named_parameters(prefix + name, out);
  if constexpr (sizeof...(rest) > 0) children_parameters(prefix, out, rest...);
}

// A host tensor every rank builds alike, as a tensor like `ref`: itself on
// one rank, replicated over `ref`'s mesh (each rank keeps its own copy, no
// communication) on DTensors.
Tensor like(const Tensor& ref, const Tensor& host) { return host.to(ref.device()).to(ref.dtype()); }
DTensor like(const DTensor& ref, const Tensor& host) {
  return from_full(host.to(ref.dtype()), ref.mesh(), Layout::replicated(ref.mesh().ndim()));
}

// The additive causal mask [T, Tk] for T queries at positions
// past .. past+T-1 against Tk = past + T keys: 0 where the key is not in
// the future, -inf where it is. Built whole on every rank (it is T x Tk
// and never sent); the attention heads and batch it broadcasts over stay
// sharded.
Tensor causal_mask(std::int64_t queries, std::int64_t past) {
  const std::int64_t keys = past + queries;
  std::vector<double> m(static_cast<std::size_t>(queries * keys), 0.0);
  for (std::int64_t i = 0; i < queries; ++i)
    for (std::int64_t j = past + i + 1; j < keys; ++j)
      m[static_cast<std::size_t>(i * keys + j)] = -std::numeric_limits<double>::infinity();
  return Tensor::from_vector(m, {queries, keys});
}

}  // namespace

ParameterFactory<Tensor> plain_parameters(DType dtype) {
  return [dtype](const std::string&, const Shape& shape, Init init, std::uint64_t seed) {
    switch (init.kind) {
      case Init::Zeros: return Tensor::zeros(shape, dtype);
      case Init::Ones: return Tensor::ones(shape, dtype);
      case Init::Normal: break;
    }
    return mul(Tensor::randn(shape, dtype, seed), init.std);
  };
}

template <TensorOrDTensor X>
X Linear<X>::operator()(const X& x, const ActivationLayouts* layouts, std::optional<Point> output_point) const {
  // Without an output point the bias folds into the GEMM (linear_bias: C
  // starts as the bias, no pass of its own); a row-parallel projection's
  // output is Partial until its point reduces it, and the bias is added
  // once, after.
  if (bias && !(layouts && output_point)) return linear(x, weight, *bias);
  X y = linear(x, weight);
  if (layouts && output_point) y = at_point(y, *layouts, *output_point);
  return bias ? add(y, *bias) : y;
}
template <TensorOrDTensor X>
void Linear<X>::named_parameters(const std::string& prefix, NamedParameters<X>& out) {
  out.emplace_back(prefix + "weight", &weight);
  if (bias) out.emplace_back(prefix + "bias", &*bias);
}

template <TensorOrDTensor X>
X Embedding<X>::operator()(const X& indices) const {
  return embedding(indices, weight);
}
template <TensorOrDTensor X>
void Embedding<X>::named_parameters(const std::string& prefix, NamedParameters<X>& out) {
  out.emplace_back(prefix + "weight", &weight);
}

template <TensorOrDTensor X>
X LayerNorm<X>::operator()(const X& x) const {
  return layer_norm(x, 1, weight, bias);
}
template <TensorOrDTensor X>
void LayerNorm<X>::named_parameters(const std::string& prefix, NamedParameters<X>& out) {
  out.emplace_back(prefix + "weight", &weight);
  out.emplace_back(prefix + "bias", &bias);
}

template <TensorOrDTensor X>
X CausalSelfAttention<X>::operator()(const X& x, const ActivationLayouts& layouts, KVCache<X>* cache,
                                     std::size_t layer) const {
  return proj(attend(x, cache, layer), &layouts, Point::AttentionOutput);
}
template <TensorOrDTensor X>
X CausalSelfAttention<X>::attend(const X& x, KVCache<X>* cache, std::size_t layer) const {
  const std::int64_t batch = x.shape()[0], len = x.shape()[1], dim = x.shape()[2], head_dim = dim / heads;
  // [B, T, D] -> [B, H, T, hd]: with the projections' output features
  // sharded over tp, whole heads stay on their rank.
  auto split_heads = [&](const X& t) { return transpose(reshape(t, {batch, len, heads, head_dim}), 1, 2); };
  const X query = split_heads(q(x));
  X key = split_heads(k(x)), value = split_heads(v(x));
  std::int64_t past = 0;
  if (cache) {
    past = cache->length;
    auto& ck = cache->keys.at(layer);
    auto& cv = cache->values.at(layer);
    if (ck) {
      key = cat({*ck, key}, 2);
      value = cat({*cv, value}, 2);
    }
    ck = key;
    cv = value;
  }
  // The scale on the query, the smaller operand ([B, H, T, hd] against the
  // scores' [B, H, T, Tk]), and the product as an einsum over the keys' own
  // layout: no transposed copy of the keys, forward or backward.
  const X scaled_query = mul(query, 1.0 / std::sqrt(static_cast<double>(head_dim)));
  X scores = einsum("bhqd,bhkd->bhqk", {scaled_query, key});
  if (len > 1) scores = add(scores, like(scores, causal_mask(len, past)));
  const X heads_out = matmul(softmax(scores, -1), value);                   // [B, H, T, hd]
  return reshape(transpose(heads_out, 1, 2), {batch, len, dim});  // [B, T, D]
}
template <TensorOrDTensor X>
void CausalSelfAttention<X>::named_parameters(const std::string& prefix, NamedParameters<X>& out) {
  children_parameters(prefix, out, "q.", q, "k.", k, "v.", v, "proj.", proj);
}

template <TensorOrDTensor X>
X MLP<X>::operator()(const X& x, const ActivationLayouts& layouts) const {
  return proj(hidden(x), &layouts, Point::MlpOutput);
}
template <TensorOrDTensor X>
X MLP<X>::hidden(const X& x) const {
  return gelu(fc(x));
}
template <TensorOrDTensor X>
void MLP<X>::named_parameters(const std::string& prefix, NamedParameters<X>& out) {
  children_parameters(prefix, out, "fc.", fc, "proj.", proj);
}

template <TensorOrDTensor X>
X Block<X>::operator()(const X& x, const ActivationLayouts& layouts, KVCache<X>* cache, std::size_t layer) const {
  const X h = add(x, attn(at_point(ln1(x), layouts, Point::AttentionInput), layouts, cache, layer));
  const X normed = at_point(ln2(h), layouts, Point::MlpInput);
  // An MoE's output is Partial over tp (as a row-parallel projection's): the
  // MLP output point reduces it.
  return add(h, moe ? at_point((*moe)(normed), layouts, Point::MlpOutput) : (*mlp)(normed, layouts));
}
template <TensorOrDTensor X>
void Block<X>::named_parameters(const std::string& prefix, NamedParameters<X>& out) {
  children_parameters(prefix, out, "ln1.", ln1, "attn.", attn, "ln2.", ln2);
  if (moe)
    moe->named_parameters(prefix + "moe.", out);
  else
    mlp->named_parameters(prefix + "mlp.", out);
}

void GPTConfig::check() const {
  auto positive = [](std::int64_t v, const char* what) {
    if (v <= 0) throw ValueError(fmt::format("[GPT] {} = {}; expected a positive size", what, v));
  };
  positive(vocab, "vocab");
  positive(seq, "seq");
  positive(layers, "layers");
  positive(d_model, "d_model");
  positive(heads, "heads");
  if (d_model % heads != 0)
    throw ValueError(fmt::format("[GPT] d_model = {} is not divisible by heads = {}", d_model, heads));
  if (!is_floating(dtype)) throw DTypeError(fmt::format("[GPT] dtype {}; expected a floating dtype", dtype));
  moe.check();
}

template <TensorOrDTensor X>
GPT<X> GPT<X>::init(const GPTConfig& config, std::uint64_t seed, const ParameterFactory<X>& make,
                    ActivationLayouts layouts) {
  config.check();
  const std::int64_t D = config.d_model;
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config.layers));
  std::uint64_t next = seed;
  auto param = [&](const std::string& name, Shape shape, Init init) {
    X p = make(name, shape, init, next++);
    p.requires_grad_();
    return p;
  };
  auto linear_layer = [&](const std::string& name, std::int64_t out, std::int64_t in, double std, bool bias) {
    Linear<X> l{param(name + "weight", {out, in}, {Init::Normal, std}), std::nullopt};
    if (bias) l.bias = param(name + "bias", {out}, {Init::Zeros});
    return l;
  };
  auto norm = [&](const std::string& name) {
    return LayerNorm<X>{param(name + "weight", {D}, {Init::Ones}), param(name + "bias", {D}, {Init::Zeros})};
  };
  // Made in named_parameters() order, so that seeds follow the names.
  Embedding<X> wte{param("wte.weight", {config.vocab, D}, {})};
  Embedding<X> wpe{param("wpe.weight", {config.seq, D}, {})};
  std::vector<Block<X>> blocks;
  for (std::int64_t l = 0; l < config.layers; ++l) {
    const std::string b = fmt::format("blocks.{}.", l);
    LayerNorm<X> ln1 = norm(b + "ln1.");
    Linear<X> q = linear_layer(b + "attn.q.", D, D, 0.02, true);
    Linear<X> k = linear_layer(b + "attn.k.", D, D, 0.02, true);
    Linear<X> v = linear_layer(b + "attn.v.", D, D, 0.02, true);
    Linear<X> proj = linear_layer(b + "attn.proj.", D, D, residual_std, true);
    LayerNorm<X> ln2 = norm(b + "ln2.");
    Block<X> block{std::move(ln1),
                   CausalSelfAttention<X>{std::move(q), std::move(k), std::move(v), std::move(proj), config.heads},
                   std::move(ln2), std::nullopt, std::nullopt};
    if (config.moe.in_block(l)) {
      // The experts' matrices as one tensor each, the expert first; the
      // same initialisation as the MLP's.
      const std::int64_t E = config.moe.experts;
      X router = param(b + "moe.router.weight", {E, D}, {Init::Normal, 0.02});
      X fc_w = param(b + "moe.experts.fc.weight", {E, 4 * D, D}, {Init::Normal, 0.02});
      X fc_b = param(b + "moe.experts.fc.bias", {E, 4 * D}, {Init::Zeros});
      X proj_w = param(b + "moe.experts.proj.weight", {E, D, 4 * D}, {Init::Normal, residual_std});
      X proj_b = param(b + "moe.experts.proj.bias", {E, D}, {Init::Zeros});
      block.moe = MoE<X>{std::move(router), std::move(fc_w), std::move(fc_b), std::move(proj_w), std::move(proj_b),
                         config.moe};
    } else {
      Linear<X> fc = linear_layer(b + "mlp.fc.", 4 * D, D, 0.02, true);
      Linear<X> fc_proj = linear_layer(b + "mlp.proj.", D, 4 * D, residual_std, true);
      block.mlp = MLP<X>{std::move(fc), std::move(fc_proj)};
    }
    blocks.push_back(std::move(block));
  }
  LayerNorm<X> ln_f = norm("ln_f.");
  // Tied: made last as before, so that every other parameter keeps its seed.
  Linear<X> lm_head =
      config.tie_embeddings ? Linear<X>{wte.weight, std::nullopt} : linear_layer("lm_head.", config.vocab, D, 0.02, false);
  return GPT{config,
             std::move(wte),
             std::move(wpe),
             std::move(blocks),
             std::move(ln_f),
             std::move(lm_head),
             std::move(layouts),
             {},
             true,
             true,
             true,
             {},
             {},
             false,
             true,
             2};
}

template <TensorOrDTensor X>
X GPT<X>::logits(const X& tokens, KVCache<X>* cache) const {
  if constexpr (std::same_as<X, DTensor>) {
    // Domino overlaps a training step; a generation step (cache) runs whole.
    if (domino && !cache) return detail::domino_logits(*this, tokens);
    if (!units.empty()) return detail::fully_sharded_logits(*this, tokens, cache);
    if (!gathered_layouts.empty()) return detail::gathered_blocks_logits(*this, tokens, cache);
  }
  return forward_with(tokens, cache, wte, wpe, ln_f, head(wte, lm_head),
                      [&](const X& x, std::size_t l) { return blocks[l](x, layouts, cache, l); });
}

template <TensorOrDTensor X>
X GPT<X>::forward_with(const X& tokens, KVCache<X>* cache, const Embedding<X>& tok_emb, const Embedding<X>& pos_emb,
                       const LayerNorm<X>& final_norm, const Linear<X>& head,
                       const std::function<X(const X&, std::size_t)>& run_block) const {
  if (tokens.dim() != 2 || tokens.dtype() != DType::Int64)
    throw ShapeError(fmt::format("[GPT] tokens of shape {} and dtype {}; expected i64 [batch, seq]",
                                 fmt::join(tokens.shape(), "x"), tokens.dtype()));
  const std::int64_t len = tokens.shape()[1], past = cache ? cache->length : 0;
  if (past + len > config.seq)
    throw ShapeError(fmt::format("[GPT] positions up to {}; the model has {} (seq)", past + len, config.seq));
  if (cache && cache->keys.empty()) {
    cache->keys.resize(blocks.size());
    cache->values.resize(blocks.size());
  }
  X x = embed_tokens(tok_emb, pos_emb, tokens, past, layouts);
  for (std::size_t l = 0; l < blocks.size(); ++l) x = run_block(x, l);
  if (cache) cache->length += len;
  return head_logits(final_norm, head, x, layouts);
}

template <TensorOrDTensor X>
Linear<X> GPT<X>::head(const Embedding<X>& token_embedding, const Linear<X>& own) const {
  return config.tie_embeddings ? Linear<X>{token_embedding.weight, std::nullopt} : own;
}

template <TensorOrDTensor X>
X GPT<X>::loss(const X& tokens, const X& targets) const {
  X out = next_byte_loss(logits(tokens), targets);
  for (const Block<X>& block : blocks)
    if (block.moe && block.moe->state->pending_loss) {
      out = add(out, *block.moe->state->pending_loss);
      block.moe->state->pending_loss.reset();
    }
  return out;
}

template <TensorOrDTensor X>
void GPT<X>::end_moe_step() {
  for (Block<X>& block : blocks)
    if (block.moe) block.moe->end_step();
}

template <TensorOrDTensor X>
X embed_tokens(const Embedding<X>& wte, const Embedding<X>& wpe, const X& tokens, std::int64_t past,
               const ActivationLayouts& layouts) {
  // Tokens [B, T, D] plus positions [T, D], then the plan's layout: with a
  // vocab-parallel table the sum is Partial, reduced once for both.
  const std::int64_t len = tokens.shape()[1];
  return at_point(add(wte(tokens), narrow(wpe.weight, 0, past, len)), layouts, Point::TokenEmbedding);
}

template <TensorOrDTensor X>
X head_logits(const LayerNorm<X>& ln_f, const Linear<X>& lm_head, const X& x, const ActivationLayouts& layouts) {
  return lm_head(at_point(ln_f(x), layouts, Point::HeadInput));
}

template <TensorOrDTensor X>
X next_byte_loss(const X& logits, const X& targets) {
  const std::int64_t rows = logits.shape()[0] * logits.shape()[1], vocab = logits.shape()[2];
  return cross_entropy(reshape(logits, {rows, vocab}), reshape(targets, {rows}));
}

template Tensor embed_tokens(const Embedding<Tensor>&, const Embedding<Tensor>&, const Tensor&, std::int64_t,
                             const ActivationLayouts&);
template DTensor embed_tokens(const Embedding<DTensor>&, const Embedding<DTensor>&, const DTensor&, std::int64_t,
                              const ActivationLayouts&);
template Tensor head_logits(const LayerNorm<Tensor>&, const Linear<Tensor>&, const Tensor&, const ActivationLayouts&);
template DTensor head_logits(const LayerNorm<DTensor>&, const Linear<DTensor>&, const DTensor&,
                             const ActivationLayouts&);
template Tensor next_byte_loss(const Tensor&, const Tensor&);
template DTensor next_byte_loss(const DTensor&, const DTensor&);

template <TensorOrDTensor X>
std::vector<X> FlatUnit<X>::unflatten(const X& gathered_flat) const {
  // One split: its backward is one cat of the members' gradients.
  std::vector<std::int64_t> sizes;
  for (const Shape& shape : shapes) sizes.push_back(numel(shape));
  std::vector<X> out = split(gathered_flat, 0, sizes);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = reshape(out[i], shapes[i]);
  return out;
}

template <TensorOrDTensor X>
NamedParameters<X> GPT<X>::named_parameters() {
  NamedParameters<X> out;
  if (!units.empty()) {
    for (auto& unit : units) out.emplace_back(unit.name + ".flat", &unit.flat);
    return out;
  }
  wte.named_parameters("wte.", out);
  wpe.named_parameters("wpe.", out);
  for (std::size_t l = 0; l < blocks.size(); ++l) blocks[l].named_parameters(fmt::format("blocks.{}.", l), out);
  ln_f.named_parameters("ln_f.", out);
  if (!config.tie_embeddings) lm_head.named_parameters("lm_head.", out);
  return out;
}

template <TensorOrDTensor X>
std::vector<X> GPT<X>::parameters() {
  std::vector<X> out;
  for (auto& [name, p] : named_parameters()) out.push_back(*p);
  return out;
}

template struct Linear<Tensor>;
template struct Linear<DTensor>;
template struct Embedding<Tensor>;
template struct Embedding<DTensor>;
template struct LayerNorm<Tensor>;
template struct LayerNorm<DTensor>;
template struct CausalSelfAttention<Tensor>;
template struct CausalSelfAttention<DTensor>;
template struct MLP<Tensor>;
template struct MLP<DTensor>;
template struct Block<Tensor>;
template struct Block<DTensor>;
template struct FlatUnit<Tensor>;
template struct FlatUnit<DTensor>;
template struct GPT<Tensor>;
template struct GPT<DTensor>;

}  // namespace dtensor::nn
