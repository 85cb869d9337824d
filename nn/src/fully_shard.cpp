// FSDP (ZeRO-3) on the GPT: flat units sharded over the data-parallel mesh
// dims, gathered for use, the blocks recomputed so that their gathered
// parameters are freed after the forward and gathered again for the
// backward.
#include <fmt/format.h>

#include <memory>
#include <optional>
#include <utility>

#include "dtensor/api/autograd.h"
#include "dtensor/api/coalesced.h"
#include "dtensor/api/pointwise.h"
#include "dtensor/api/shape_ops.h"
#include "dtensor/core/error.h"
#include "dtensor/nn/modules.h"

namespace dtensor::nn {
namespace {

// Whether going from `from` to `to` on `mesh` moves no data: they differ
// only on mesh dims of one rank (an fsdp dim of size 1). Then there is no
// gathered copy to free after the forward, and recomputing the block in the
// backward would only repeat its work (a one-rank fsdp step ran at 0.69 of
// plain, 2026-12-04).
bool gathers_locally(const DeviceMesh& mesh, const Layout& from, const Layout& to) {
  for (int m = 0; m < mesh.ndim(); ++m)
    if (mesh.size(m) > 1 && !(from[m] == to[m])) return false;
  return true;
}

struct UnitMembers {
  std::string name;
  NamedParameters<DTensor> members;
};

// The root's parameters (embeddings, final norm, lm_head unless tied to
// the token embedding), in named_parameters() order.
void root_parameters(Embedding<DTensor>& wte, Embedding<DTensor>& wpe, LayerNorm<DTensor>& ln_f,
                     Linear<DTensor>& head, bool tied, NamedParameters<DTensor>& out) {
  wte.named_parameters("wte.", out);
  wpe.named_parameters("wpe.", out);
  ln_f.named_parameters("ln_f.", out);
  if (!tied) head.named_parameters("lm_head.", out);
}

// The root's parameters, then each block's: the units' contents.
std::vector<UnitMembers> unit_members(GPT<DTensor>& model) {
  std::vector<UnitMembers> out(1 + model.blocks.size());
  out[0].name = "root";
  root_parameters(model.wte, model.wpe, model.ln_f, model.lm_head, model.config.tie_embeddings, out[0].members);
  for (std::size_t l = 0; l < model.blocks.size(); ++l) {
    out[l + 1].name = fmt::format("blocks.{}", l);
    model.blocks[l].named_parameters(out[l + 1].name + ".", out[l + 1].members);
  }
  return out;
}

FlatUnit<DTensor> flatten(const UnitMembers& group, const Layout& flat_layout) {
  std::vector<std::string> names;
  std::vector<Shape> shapes;
  std::vector<Tensor> pieces;
  const DeviceMesh& mesh = group.members.front().second->mesh();
  for (const auto& [name, p] : group.members) {
    for (int m = 0; m < p->placements().mesh_ndim(); ++m)
      if (!is_replicate(p->placements()[m]))
        throw LayoutError(
            fmt::format("[fully_shard] parameter {} is laid out {}; fully sharding needs every "
                        "parameter replicated (FSDP over tensor parallelism is not supported)",
                        name, p->placements()));
    names.push_back(name);
    shapes.push_back(p->shape());
    pieces.push_back(reshape(p->detach().to_local(), {numel(p->shape())}));
  }
  DTensor flat = from_full(cat(std::span<const Tensor>(pieces), 0), mesh, flat_layout);
  flat.requires_grad_();
  return FlatUnit<DTensor>{group.name, std::move(flat), std::move(names), std::move(shapes),
                           Layout::replicated(mesh.ndim())};
}

}  // namespace

void fully_shard(GPT<DTensor>& model, const Layout& flat_layout) {
  if (!model.units.empty()) throw ValueError("[fully_shard] the model is already fully sharded");
  NoGradGuard unrecorded;
  const std::vector<UnitMembers> groups = unit_members(model);
  std::vector<FlatUnit<DTensor>> units;
  for (const UnitMembers& group : groups) units.push_back(flatten(group, flat_layout));
  // The flats hold the values now; the members keep the structure only.
  for (std::size_t u = 0; u < groups.size(); ++u)
    for (const auto& member : groups[u].members) *member.second = units[u].flat;
  model.units = std::move(units);
}

namespace detail {

namespace {

// Gathers of block units ahead of their use: unit u's all_gather starts on
// the rank's worker while the block before it computes (in the forward)
// or the block after it (in the backward), and the block takes it when it
// runs. At most one gather is in flight, so at most two units are gathered
// at once (the one in use and the next).
class UnitPrefetch {
 public:
  explicit UnitPrefetch(const GPT<DTensor>& model) : model_(model) {}
  /// Starts unit u's gather, where it moves data and prefetch is on.
  void start(std::size_t u) {
    if (!model_.prefetch_units || u == 0 || u >= model_.units.size()) return;
    const FlatUnit<DTensor>& unit = model_.units[u];
    if (gathers_locally(unit.flat.mesh(), unit.flat.placements(), unit.gathered)) return;
    unit_ = u;
    started_ =
        start_redistribute_all(std::span<const DTensor>(&unit.flat, 1), std::span<const Layout>(&unit.gathered, 1));
  }
  /// Unit u gathered (unrecorded), if it was started.
  std::optional<DTensor> take(std::size_t u) {
    if (!started_ || unit_ != u) return std::nullopt;
    std::vector<DTensor> out = started_->wait();
    started_.reset();
    return std::move(out.front());
  }

 private:
  const GPT<DTensor>& model_;
  std::size_t unit_ = 0;
  std::optional<StartedRedistribution> started_;
};

// The backward's side of one forward's graph. Block l's recompute takes
// its unit's gather if the block after it started one, and starts the
// gather of the block before it (FSDP2's backward prefetch); without
// resharding, the forward's gather is recorded instead (attach). With
// overlap_unit_reduce, a unit's gradient leaves by a reduce_scatter
// started when its block's backward ends and waited for when the next
// unit's starts (at most one in flight, as in FSDP2), the last one by the
// root's gather's backward, which runs after every block's (it is the
// graph's oldest node): when backward() returns, every flat holds its
// gradient, added as the engine adds it.
class UnitBackward {
 public:
  UnitBackward(const GPT<DTensor>& model, bool defer) : model_(model), prefetch_(model), defer_(defer) {}
  UnitBackward(const UnitBackward&) = delete;
  UnitBackward& operator=(const UnitBackward&) = delete;

  /// Unit u gathered for its block's backward from `flat` (the
  /// recomputation's leaf for the unit), recorded so that its gradient
  /// goes back to the flat's layout: returned to `flat` at once, or (with
  /// overlap_unit_reduce) started and added to the unit's flat later.
  DTensor gathered(const std::shared_ptr<UnitBackward>& self, std::size_t u, const DTensor& flat) {
    const FlatUnit<DTensor>& unit = model_.units[u];
    std::optional<DTensor> value = prefetch_.take(u);
    if (!value) {
      NoGradGuard unrecorded;
      value = flat.redistribute(unit.gathered);
    }
    prefetch_.start(u - 1);  // the block before's unit, under this block's backward
    return attach(self, u, flat, std::move(*value));
  }

  /// `value`, unit u gathered from `flat`, recorded so that its gradient
  /// goes back to the flat's layout (the forward's gather of a unit kept
  /// for the backward, or the recomputation's).
  DTensor attach(const std::shared_ptr<UnitBackward>& self, std::size_t u, const DTensor& flat, DTensor value) {
    const Layout back = flat.placements().without_partial();
    return record_custom("fsdp unit gather", std::span<const DTensor>(&flat, 1), std::move(value),
                         [self, u, back](const DTensor& grad) { return self->reduce(u, grad, back); });
  }

  /// The root gathered, recorded: its backward first completes the last
  /// block's reduction, then sends the root's gradient back as a
  /// redistribute does.
  DTensor gathered_root(const std::shared_ptr<UnitBackward>& self) {
    const FlatUnit<DTensor>& root = model_.units.front();
    DTensor value = [&] {
      NoGradGuard unrecorded;
      return root.flat.redistribute(root.gathered);
    }();
    const Layout back = root.flat.placements().without_partial();
    return record_custom("fsdp root gather", std::span<const DTensor>(&root.flat, 1), std::move(value),
                         [self, back](const DTensor& grad) -> std::vector<std::optional<DTensor>> {
                           self->drain();
                           return {grad.redistribute(back)};
                         });
  }

 private:
  std::vector<std::optional<DTensor>> reduce(std::size_t u, const DTensor& grad, const Layout& back) {
    if (!defer_) return {grad.redistribute(back)};
    drain();
    reduce_ = start_redistribute_all(std::span<const DTensor>(&grad, 1), std::span<const Layout>(&back, 1));
    reduce_unit_ = u;
    return {std::nullopt};
  }
  /// Waits for the reduction in flight and adds it to its unit's gradient.
  void drain() {
    if (!reduce_) return;
    std::vector<DTensor> reduced = reduce_->wait();
    reduce_.reset();
    DTensor flat = model_.units[reduce_unit_].flat;  // shares the parameter's gradient
    const std::optional<DTensor> held = flat.grad();
    flat.set_grad(held ? add(*held, reduced.front()) : reduced.front());
  }

  const GPT<DTensor>& model_;
  UnitPrefetch prefetch_;
  bool defer_;
  std::optional<StartedRedistribution> reduce_;
  std::size_t reduce_unit_ = 0;
};

// Whether a block's run records: the backward's recomputation, or the
// forward where the block is not recomputed (a recomputed block's forward
// runs without grad; nothing records where no input needs a gradient).
bool recording(std::span<const DTensor> in) {
  return grad_enabled() && (in[0].requires_grad() || in[1].requires_grad());
}

}  // namespace

DTensor fully_sharded_logits(const GPT<DTensor>& model, const DTensor& tokens, KVCache<DTensor>* cache) {
  // The root stays gathered from the embedding to the lm_head and through
  // the backward: one all_gather, and one reduce_scatter of its gradient.
  const FlatUnit<DTensor>& root = model.units.front();
  // Deferred reductions need the root's node, which completes them.
  const bool defer = model.overlap_unit_reduce && grad_enabled() && root.flat.requires_grad();
  const auto backward = std::make_shared<UnitBackward>(model, defer);
  const std::vector<DTensor> r =
      root.unflatten(defer ? backward->gathered_root(backward) : root.flat.redistribute(root.gathered));
  UnitPrefetch prefetch(model);
  prefetch.start(1);  // block 0's unit, under the embedding
  const Embedding<DTensor> wte{r[0]}, wpe{r[1]};
  const LayerNorm<DTensor> ln_f{r[2], r[3]};
  // Tied, the unit has no lm_head member (4 views, not 5) and head() reads wte's.
  const Linear<DTensor> head = model.head(wte, {r.size() > 4 ? r[4] : r[0], std::nullopt});
  return model.forward_with(tokens, cache, wte, wpe, ln_f, head, [&](const DTensor& x, std::size_t l) {
    const FlatUnit<DTensor>& unit = model.units[l + 1];
    const bool local = gathers_locally(unit.flat.mesh(), unit.flat.placements(), unit.gathered);
    // The forward's run takes the prefetched gather (recompute runs it
    // unrecorded; where no input needs a gradient it is the only run). The
    // backward's run, recording, takes the backward's prefetch.
    auto prefetched = std::make_shared<std::optional<DTensor>>(prefetch.take(l + 1));
    prefetch.start(l + 2);  // the next block's unit, under this block
    // Gathers the block's unit, runs the block on views of it; run again
    // by the backward (recompute), which gathers again.
    const bool kept = !local && !model.reshard_after_forward;
    auto run_block = [&model, &unit, l, cache, prefetched, backward, local, kept](std::span<const DTensor> in) {
      Block<DTensor> block = model.blocks[l];
      NamedParameters<DTensor> members;
      block.named_parameters("", members);
      // Recorded where it runs with grad (a local gather); kept, attach()
      // records it instead.
      auto forward_gather = [&] {
        if (*prefetched) return *std::exchange(*prefetched, std::nullopt);
        std::optional<NoGradGuard> unrecorded;
        if (kept) unrecorded.emplace();
        return in[1].redistribute(unit.gathered);
      };
      const DTensor whole = local || !recording(in) ? forward_gather()
                            : kept                  ? backward->attach(backward, l + 1, in[1], forward_gather())
                                                    : backward->gathered(backward, l + 1, in[1]);
      const std::vector<DTensor> views = unit.unflatten(whole);
      for (std::size_t i = 0; i < members.size(); ++i) *members[i].second = views[i];
      return block(in[0], model.layouts, cache, l);
    };
    const DTensor inputs[] = {x, unit.flat};
    if (local || kept) return run_block(std::span<const DTensor>(inputs));
    return recompute(run_block, std::span<const DTensor>(inputs));
  });
}

void gather_parameters(const NamedParameters<DTensor>& members, std::span<const Layout> gathered, const char* what) {
  if (members.size() != gathered.size())
    throw ValueError(fmt::format("[fully_shard] {} gathered layouts for the {}'s {} parameters", gathered.size(), what,
                                 members.size()));
  std::vector<DTensor> params;
  for (const auto& member : members) params.push_back(*member.second);
  std::vector<DTensor> out = redistribute_all(params, gathered);
  for (std::size_t i = 0; i < members.size(); ++i) *members[i].second = std::move(out[i]);
}

DTensor gathered_block(const Block<DTensor>& shards, std::span<const Layout> gathered, const DTensor& x,
                       const ActivationLayouts& layouts, KVCache<DTensor>* cache, std::size_t layer) {
  Block<DTensor> held = shards;
  NamedParameters<DTensor> members;
  held.named_parameters("", members);
  std::vector<DTensor> params;
  for (const auto& member : members) params.push_back(*member.second);
  // Runs the block on its gathered parameters; run again by the backward,
  // which gathers them again. Holds its own copies of what it reads then.
  auto run_block = [held, layouts, cache, layer](std::span<const DTensor> in, std::span<const DTensor> whole) {
    Block<DTensor> block = held;
    NamedParameters<DTensor> slots;
    block.named_parameters("", slots);
    for (std::size_t i = 0; i < slots.size(); ++i) *slots[i].second = whole[i];
    return block(in[0], layouts, cache, layer);
  };
  const DTensor inputs[] = {x};
  bool local = true;
  for (std::size_t i = 0; i < params.size(); ++i)
    local = local && gathers_locally(params[i].mesh(), params[i].placements(), gathered[i]);
  if (local) return run_block(inputs, redistribute_all(params, gathered));
  return recompute_gathered(run_block, inputs, params, gathered);
}

DTensor gathered_blocks_logits(const GPT<DTensor>& model, const DTensor& tokens, KVCache<DTensor>* cache) {
  // The root's parameters gathered together (one all_gather; recorded, so
  // their gradients leave together: one reduce_scatter at the backward's end).
  Embedding<DTensor> wte = model.wte, wpe = model.wpe;
  LayerNorm<DTensor> ln_f = model.ln_f;
  Linear<DTensor> head = model.lm_head;
  if (!model.root_gathered_layouts.empty()) {
    NamedParameters<DTensor> root;
    root_parameters(wte, wpe, ln_f, head, model.config.tie_embeddings, root);
    gather_parameters(root, model.root_gathered_layouts, "root");
  }
  return model.forward_with(tokens, cache, wte, wpe, ln_f, model.head(wte, head),
                            [&](const DTensor& x, std::size_t l) {
                              return gathered_block(model.blocks[l], model.gathered_layouts[l], x, model.layouts,
                                                    cache, l);
                            });
}

}  // namespace detail
}  // namespace dtensor::nn
