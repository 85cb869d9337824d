#pragma once
// The module layer: the pieces of a GPT-2-style transformer, written once on
// the front end so that the same code runs on plain Tensors (one rank) and on
// DTensors (any mesh, any plan).
//
//   nn::GPTConfig config{.layers = 2, .d_model = 64, .heads = 4, .seq = 32};
//   auto model = nn::GPT<DTensor>::init(config, seed, nn::plan_parameters(mesh, plan));
//   DTensor loss = model.loss(tokens, targets);   // tokens, targets: i64 [B, T]
//   loss.backward();
//
// A module holds its parameters as members and lists them by name
// (named_parameters(): "blocks.0.attn.q.weight", ...): a ParallelPlan maps
// those names to layouts. The layouts between the pieces are left to
// propagation except at the few activation points a plan names (`Point`):
// there the model asks for the plan's layout, and the planner picks the
// collective (Megatron's all_reduce after a row-parallel linear, sequence
// parallelism's all_gather and reduce_scatter).
#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/api/functional.h"
#include "dtensor/nn/moe.h"

namespace dtensor::nn {

/// A parameter by name, pointing into its module.
template <TensorOrDTensor X>
using NamedParameters = std::vector<std::pair<std::string, X*>>;

/// The activation points at which a plan may fix a layout.
enum class Point : std::uint8_t {
  TokenEmbedding,   // the token embedding's output, before the positions are added
  AttentionInput,   // attention's input (after its layer norm)
  AttentionOutput,  // attention's output projection, before its bias and the residual add
  MlpInput,         // the MLP's input (after its layer norm)
  MlpOutput,        // the MLP's output projection, before its bias and the residual add
  HeadInput,        // the lm_head's input (after the final layer norm)
};
inline constexpr std::size_t kPoints = 6;

/// The layout asked for at each point (none: propagation's choice). On
/// Tensors every point is a no-op.
struct ActivationLayouts {
  std::array<std::optional<Layout>, kPoints> at;
  const std::optional<Layout>& operator[](Point p) const { return at[static_cast<std::size_t>(p)]; }
  std::optional<Layout>& operator[](Point p) { return at[static_cast<std::size_t>(p)]; }
};

/// `x` in the layout `layouts` asks for at `p` (x itself on Tensors, or
/// where nothing is asked or it already is).
Tensor at_point(const Tensor& x, const ActivationLayouts& layouts, Point p);
DTensor at_point(const DTensor& x, const ActivationLayouts& layouts, Point p);

/// How a parameter starts: N(0, std^2), zeros or ones.
struct Init {
  enum Kind : std::uint8_t { Normal, Zeros, Ones } kind = Normal;
  double std = 0.02;
};
/// Makes a parameter given its name and shape; every model's parameters
/// are made in the same order, the i-th with seed + i, so that any layout
/// holds the same values (DTensor's randn is Tensor's on any layout).
template <TensorOrDTensor X>
using ParameterFactory = std::function<X(const std::string& name, const Shape& shape, Init init, std::uint64_t seed)>;

/// The factory for one plain rank.
ParameterFactory<Tensor> plain_parameters(DType dtype);

template <TensorOrDTensor X>
struct Linear {
  X weight;               // [out, in]
  std::optional<X> bias;  // [out]
  /// x W^T + b. The bias is added after `output_point` (if any), so that a
  /// row-parallel projection's Partial sum is reduced before it: the bias is
  /// then added once, not once per rank.
  X operator()(const X& x, const ActivationLayouts* layouts = nullptr, std::optional<Point> output_point = {}) const;
  void named_parameters(const std::string& prefix, NamedParameters<X>& out);
};

template <TensorOrDTensor X>
struct Embedding {
  X weight;  // [rows, dim]
  X operator()(const X& indices) const;
  void named_parameters(const std::string& prefix, NamedParameters<X>& out);
};

template <TensorOrDTensor X>
struct LayerNorm {
  X weight, bias;  // [dim]
  X operator()(const X& x) const;
  void named_parameters(const std::string& prefix, NamedParameters<X>& out);
};

/// Keys and values of the positions seen so far, per layer ([B, H, t, hd]),
/// for generation one token at a time.
template <TensorOrDTensor X>
struct KVCache {
  std::vector<std::optional<X>> keys, values;
  std::int64_t length = 0;  // positions cached
};

/// Multi-head causal self-attention. q, k and v are separate projections so
/// that sharding their output features over tp splits whole heads (one
/// fused qkv weight would interleave q, k and v across ranks).
template <TensorOrDTensor X>
struct CausalSelfAttention {
  Linear<X> q, k, v, proj;
  std::int64_t heads = 1;
  /// x [B, T, D]; with a cache, x holds the positions after the cached ones,
  /// whose keys and values are appended to it (`layer` picks the cache's).
  X operator()(const X& x, const ActivationLayouts& layouts, KVCache<X>* cache = nullptr, std::size_t layer = 0) const;
  /// The heads' outputs merged, [B, T, D], before the output projection.
  X attend(const X& x, KVCache<X>* cache = nullptr, std::size_t layer = 0) const;
  void named_parameters(const std::string& prefix, NamedParameters<X>& out);
};

template <TensorOrDTensor X>
struct MLP {
  Linear<X> fc, proj;  // D -> 4D -> D, GELU between
  X operator()(const X& x, const ActivationLayouts& layouts) const;
  /// GELU(fc(x)), the output projection's input.
  X hidden(const X& x) const;
  void named_parameters(const std::string& prefix, NamedParameters<X>& out);
};

/// Pre-LN transformer block: x + attn(ln1(x)), then + mlp(ln2(.)), or
/// + moe(ln2(.)) in a mixture-of-experts block (exactly one of the two).
template <TensorOrDTensor X>
struct Block {
  LayerNorm<X> ln1;
  CausalSelfAttention<X> attn;
  LayerNorm<X> ln2;
  std::optional<MLP<X>> mlp;
  std::optional<MoE<X>> moe;
  X operator()(const X& x, const ActivationLayouts& layouts, KVCache<X>* cache = nullptr, std::size_t layer = 0) const;
  void named_parameters(const std::string& prefix, NamedParameters<X>& out);
};

struct GPTConfig {
  std::int64_t vocab = 256;  // byte-level
  std::int64_t seq = 64;     // the longest sequence (position embedding rows)
  std::int64_t layers = 2;
  std::int64_t d_model = 64;
  std::int64_t heads = 4;
  DType dtype = DType::Float32;
  /// The lm_head reuses the token embedding's weight (GPT-2's tie): one
  /// parameter, "wte.weight", whose gradient sums both uses.
  bool tie_embeddings = false;
  /// Mixture of experts in place of the MLP of some blocks (moe.h); off by
  /// default.
  MoEConfig moe{};
  /// ValueError naming the value unless every size is positive and heads
  /// divide d_model.
  void check() const;
};

/// FSDP's unit of sharding: several parameters flattened and concatenated
/// into one 1-D tensor, laid out S(0) over the sharding mesh dims, and
/// gathered whole for use (PyTorch FSDP1's FlatParameter).
template <TensorOrDTensor X>
struct FlatUnit {
  std::string name;                // "root", "blocks.0", ...
  X flat;                          // the leaf the optimizer updates
  std::vector<std::string> names;  // the members, in order
  std::vector<Shape> shapes;
  Layout gathered;  // the layout the members are used in
  /// The members as views of a gathered `flat` (recorded: their gradients
  /// flow back into it).
  std::vector<X> unflatten(const X& gathered_flat) const;
};

/// GPT-2: token and learned position embeddings, pre-LN blocks, a final
/// layer norm and an lm_head. By default the lm_head has its own weight;
/// with config.tie_embeddings it holds the token embedding's (the same
/// tensor: [vocab, d_model] is both the table and the [out, in] weight, and
/// the plans lay both out alike, S(0) over the vocabulary under tp), listed
/// once by named_parameters().
template <TensorOrDTensor X>
struct GPT {
  GPTConfig config;
  Embedding<X> wte, wpe;
  std::vector<Block<X>> blocks;
  LayerNorm<X> ln_f;
  Linear<X> lm_head;
  ActivationLayouts layouts;  // what the plan asks for between the pieces
  /// Fully sharded (FSDP, ZeRO-3; see fully_shard): when not empty, the
  /// parameters are these units' flats (unit 0 the root: embeddings, final
  /// norm and lm_head; unit l + 1 block l), and the members above only give
  /// the structure (each holds its unit's flat as a placeholder).
  std::vector<FlatUnit<X>> units;
  /// FSDP's prefetch (FSDP2's, on by default): the next block's unit is
  /// gathered on the rank's communication worker while this block computes,
  /// in the forward and, in reverse order, in the backward, so at most two
  /// units are gathered at once. Off: each unit is gathered when its block
  /// runs. The same values and collectives either way.
  bool prefetch_units = true;
  /// FSDP's gradient reduction under the backward (FSDP2's, on by default):
  /// a block's reduce_scatter starts when its backward ends and is waited
  /// for when the next block's starts, so it runs under the block before's
  /// backward; the root's, last, completes the step's. When backward()
  /// returns, every unit's flat holds its gradient either way (the same
  /// values and collectives), but the units' on_gradient_ready hooks do not
  /// run. Off: each reduce_scatter blocks the backward.
  bool overlap_unit_reduce = true;
  /// FSDP2's reshard_after_forward (on by default): a block's gathered unit
  /// is freed after its forward, and the block is recomputed in the
  /// backward, which gathers the unit again. Off: the forward's gather is
  /// kept for the backward (no second gather, no recomputation; every
  /// block's unit stays gathered from its forward to its backward, as
  /// ZeRO-2's parameters are whole).
  bool reshard_after_forward = true;
  /// FSDP over tensor parallelism (FSDP2's per-parameter sharding): when
  /// not empty, block l's parameters (named_parameters() order) are shards
  /// of the fsdp dims, gathered to `gathered_layouts[l]` for the block by
  /// recompute_gathered: one all_gather in the forward, one again in the
  /// backward, one reduce_scatter of the gradients where they allow.
  std::vector<std::vector<Layout>> gathered_layouts;
  /// The same for the root's parameters (wte, wpe, ln_f, lm_head in
  /// named_parameters() order), gathered by one recorded redistribute_all
  /// before the embedding and kept through the backward, which sends their
  /// gradients back in one call. Empty: the root is used as it is laid out.
  std::vector<Layout> root_gathered_layouts;
  /// Domino's tensor-parallel overlap (Wang et al. 2024; off by default):
  /// a training forward splits each rank's batch rows into chunks (halves
  /// by default: domino_chunks) and runs the blocks on them in turn,
  /// starting each chunk's collective at the plan's block points (the
  /// all_reduce or reduce_scatter after a row-parallel projection, the
  /// all_gather before a column-parallel one) and waiting for it only when
  /// that chunk needs the result, so one chunk's collectives run under the
  /// others' computation, in the forward and, mirrored, in the backward
  /// (start_redistribute). Each point's calls as an unsplit step's, one per
  /// chunk, the same bytes in all. ValueError for MoE blocks, fully sharded
  /// models, or a batch whose rows per rank do not split into the chunks.
  bool domino = false;
  /// Off: the same chunks, the same calls in the same order, each waited
  /// for at once (the reference Domino's values equal bit for bit).
  bool domino_started = true;
  /// Domino's chunks of each rank's rows (2: halves). More chunks hide a
  /// collective that follows a short stage (tp_sp's all_gather after a
  /// layer norm) under more of the others' computation, at smaller GEMMs
  /// and more calls. ValueError below 2.
  std::int64_t domino_chunks = 2;

  /// Parameters made by `make` in named_parameters() order, with GPT-2's
  /// initialisation (normal(0, 0.02), projections into the residual stream
  /// scaled by 1/sqrt(2 * layers), biases 0, norms 1), marked requires_grad.
  static GPT init(const GPTConfig& config, std::uint64_t seed, const ParameterFactory<X>& make,
                  ActivationLayouts layouts = {});

  /// Logits [B, T, vocab] of i64 tokens [B, T] (T <= seq).
  X logits(const X& tokens, KVCache<X>* cache = nullptr) const;
  /// The forward with the root's pieces given and block l run by
  /// `run_block(x, l)`: logits() passes the members, the fully sharded
  /// forward views of gathered units.
  X forward_with(const X& tokens, KVCache<X>* cache, const Embedding<X>& wte, const Embedding<X>& wpe,
                 const LayerNorm<X>& ln_f, const Linear<X>& lm_head,
                 const std::function<X(const X&, std::size_t)>& run_block) const;
  /// Mean cross entropy of the next byte, plus the MoE blocks' balancing
  /// losses of this forward: a 0-d tensor.
  X loss(const X& tokens, const X& targets) const;
  /// After each optimizer step: each MoE block's end_step() (the bias
  /// update of Balance::Bias, and the next step's load counted afresh).
  void end_moe_step();
  /// The lm_head as the forward uses it: with config.tie_embeddings, `wte`'s
  /// weight (read at each call, so that a parameter replaced by name, as a
  /// checkpoint's load does, stays tied), else `lm_head`.
  Linear<X> head(const Embedding<X>& token_embedding, const Linear<X>& lm_head) const;

  NamedParameters<X> named_parameters();
  std::vector<X> parameters();
};

/// Makes `model` fully sharded: each block, and the root (embeddings, final
/// norm, lm_head), becomes one flat unit laid out as `flat_layout` (S(0) on
/// the sharding mesh dims, Replicate on the others). A forward gathers the
/// root once (kept for the backward) and each block's unit before the block
/// (one all_gather each), and frees a block's gathered parameters after it
/// (unless GPT::reshard_after_forward is off): the block is recomputed, so
/// its backward gathers them again, and its
/// gradient leaves as one reduce_scatter into the flat's shard. Values are
/// the unsharded model's. LayoutError unless every parameter is replicated
/// (fully sharding a tensor-parallel model is not supported).
void fully_shard(GPT<DTensor>& model, const Layout& flat_layout);
namespace detail {
/// GPT<DTensor>::logits of a fully sharded model (fully_shard.cpp): flat
/// units, or per-parameter shards gathered per block.
DTensor fully_sharded_logits(const GPT<DTensor>& model, const DTensor& tokens, KVCache<DTensor>* cache);
DTensor gathered_blocks_logits(const GPT<DTensor>& model, const DTensor& tokens, KVCache<DTensor>* cache);
/// GPT<DTensor>::logits with GPT::domino on (domino.cpp).
DTensor domino_logits(const GPT<DTensor>& model, const DTensor& tokens);
/// FSDP2's per-parameter sharding, piece by piece (a whole model's forward
/// or a pipeline stage's): `members` replaced by their gathered values
/// (one recorded redistribute_all, so their gradients leave together), and
/// a block run on parameters gathered for it (recompute_gathered: gathered
/// again by the backward, one reduce_scatter of the gradients).
void gather_parameters(const NamedParameters<DTensor>& members, std::span<const Layout> gathered, const char* what);
DTensor gathered_block(const Block<DTensor>& shards, std::span<const Layout> gathered, const DTensor& x,
                       const ActivationLayouts& layouts, KVCache<DTensor>* cache, std::size_t layer);
}  // namespace detail

extern template struct GPT<Tensor>;
extern template struct GPT<DTensor>;

}  // namespace dtensor::nn
