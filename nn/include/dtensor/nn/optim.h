#pragma once
// Optimizers and gradient utilities on parameters that are Tensors or
// DTensors alike.
//
//   std::vector<DTensor> params = ...;          // leaves, requires_grad_()
//   nn::AdamW<DTensor> opt(params, {.lr = 3e-4});
//   loss.backward();
//   nn::clip_grad_norm<DTensor>(params, 1.0);    // one all_reduce over the world
//   opt.set_lr(nn::warmup_cosine_lr(step, 100, 2000, 3e-4));
//   opt.step();                                  // gradients to each parameter's layout, then the update
//   opt.zero_grad();
//
// A step first brings every gradient to the layout its update needs, all
// at once through redistribute_all (dtensor/api/coalesced.h): P(sum) -> R is
// DDP's all_reduce, P(sum) -> S(0) a reduce_scatter, and gradients that need
// the same collective share one call per bucket (25 MiB by default, as DDP).
// It then updates every rank's local shard in one pass per parameter, with
// no op dispatch: the same loops as on plain tensors. The states (momentum,
// Adam's moments) live in the parameter's layout, or in the state layouts
// ShardingOptions gives (ZeRO-1/2):
//
//   auto states = nn::zero_state_layouts(params, mesh.dim_index("dp"));  // R over dp -> S(0) over dp
//   nn::AdamW<DTensor> opt(params, {.lr = 3e-4, .sharding = {.state_layouts = states}});
//
// Then a step reduce-scatters the gradients to the state layouts, updates
// the part of each (replicated) parameter its state shard covers, and
// all-gathers the updated parts back into the parameters: one coalesced
// reduce_scatter and one coalesced all_gather over dp where DDP takes one
// all_reduce, with the states 1/dp the size. The update math is PyTorch's
// (torch.optim.SGD, torch.optim.AdamW), computed in f64 for f64 parameters
// and in f32 otherwise, the same elementwise whatever the layouts.
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "dtensor/api/coalesced.h"
#include "dtensor/api/dtensor_tensor.h"
#include "dtensor/core/tensor.h"

namespace dtensor::nn {

template <class X>
concept Parameter = std::same_as<X, Tensor> || std::same_as<X, DTensor>;

/// The buckets gradients are reduced in (DDP's all_reduce, ZeRO's
/// reduce_scatter), by a step, a clip and nn::OverlappedGradientReduction
/// alike: PyTorch DDP's, 25 MiB with a 1 MiB first bucket, filled from the
/// last parameter, so that the first bucket is complete early in a backward
/// and each later one soon after its predecessor. Other sizes keep the
/// first bucket at most 1 MiB.
inline CoalesceOptions gradient_buckets(double bucket_mib = 25) {
  return {.bucket_mib = bucket_mib, .first_bucket_mib = std::min(1.0, bucket_mib), .order = BucketOrder::LastFirst};
}

/// How a step moves the gradients and where the states live. For DTensor
/// parameters; a Tensor optimizer accepts only the defaults (ValueError).
struct ShardingOptions {
  /// The buckets of the step's redistribute_all, of gradients to their
  /// update's layouts and of updated parts back to their parameters'.
  CoalesceOptions buckets = gradient_buckets();
  /// Empty, or one layout per parameter for its states and for the
  /// gradient its update reads. Each must hold no Partial and give every
  /// rank a part of the box the parameter's layout gives it (a finer
  /// split: Shard where the parameter is Replicate, nested inside the
  /// parameter's own shards); LayoutError naming the parameter otherwise.
  /// Where it differs from the parameter's layout, a step updates that part
  /// and redistributes the updated parts back to the parameter's layout.
  std::vector<Layout> state_layouts{};
  /// ZeRO's all_gather of the updated parts overlapped with the next
  /// forward (Megatron's --overlap-param-gather): a step starts the
  /// buckets, in the reverse of the gradients' order (the forward's), and
  /// each is waited for and written into its parameters when the next read
  /// of one of them (an op of the next forward, on_next_read) comes, or by
  /// wait_parameters() and the next step. The same calls and values; they
  /// are counted where they are waited for (in the next forward).
  bool overlap_parameter_gather = false;
};

namespace detail {
struct ParameterGathers;  // optim.cpp: the started buckets of a step's write-back
}

struct SGDOptions {
  double lr = 1e-2;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;  // L2, added to the gradient (as torch.optim.SGD)
  bool nesterov = false;
  ShardingOptions sharding{};
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;  // decoupled: p -= lr * wd * p before the Adam step
  ShardingOptions sharding{};
};

/// ZeRO-1/2 state layouts: each parameter's layout with mesh dim `mesh_dim`
/// (where it is Replicate) split as Shard(0), innermost, so the state
/// shards nest inside the parameter's own; 0-d parameters and those not
/// Replicate on `mesh_dim` keep their layout. LayoutError for a mesh dim
/// out of range.
std::vector<Layout> zero_state_layouts(std::span<const DTensor> params, int mesh_dim);

/// What the optimizers share: the parameters, the learning rate, and each
/// step's gradients in the parameters' layouts.
template <Parameter X>
class Optimizer {
 public:
  const std::vector<X>& params() const { return params_; }
  double lr() const { return lr_; }
  /// ValueError naming the value unless finite and >= 0.
  void set_lr(double lr);
  /// Empties every parameter's gradient.
  void zero_grad();
  /// Steps taken.
  std::int64_t steps() const { return steps_; }
  /// The layout parameter i's states live in and its update reads its
  /// gradient in (DTensor optimizers): its own unless ShardingOptions gave one.
  const Layout& state_layout(std::size_t i) const requires std::same_as<X, DTensor> { return state_layouts_.at(i); }
  /// With overlap_parameter_gather: waits for every bucket the last step
  /// started and not yet waited for, and writes it into its parameters (a
  /// step and the first read of a parameter do it themselves; call it
  /// before reading parameters by to_local(), as a checkpoint's save does).
  /// Every rank calls it alike. Otherwise nothing.
  void wait_parameters();

 protected:
  Optimizer(std::vector<X> params, double lr, const char* name, ShardingOptions sharding);
  /// Every parameter's gradient in its state layout (none where it has
  /// none), moved by one redistribute_all per mesh: gradients that need the
  /// same collective share one call per bucket.
  std::vector<std::optional<X>> gradients_for_update() const;
  /// The shard parameter i's update writes: its local shard (shared
  /// storage) where the state layout is the parameter's, else a copy of the
  /// part of it the state layout gives this rank.
  Tensor update_shard(std::size_t i) const;
  /// Writes the updated copies (shards[i] defined where update_shard made a
  /// copy and the update ran) back into the parameters: one redistribute_all
  /// per mesh from the state layouts to the parameters' (ZeRO: the
  /// all_gather).
  void write_back(const std::vector<Tensor>& shards);
  /// write_back's all_gathers started (overlap_parameter_gather): `parts`
  /// are the updated parts of parameters `which`, going to layouts `to`.
  void start_parameter_gathers(const std::vector<std::size_t>& which, const std::vector<DTensor>& parts,
                               const std::vector<Layout>& to);
  /// A zero state in parameter i's state layout.
  X zeros_like_state(std::size_t i) const;

  std::vector<X> params_;
  double lr_;
  std::int64_t steps_ = 0;
  const char* name_;
  ShardingOptions sharding_;
  std::vector<Layout> state_layouts_;  // DTensor: one per parameter; Tensor: empty
  std::shared_ptr<detail::ParameterGathers> gathers_;  // overlap_parameter_gather: the last step's
};

template <Parameter X>
class SGD : public Optimizer<X> {
 public:
  explicit SGD(std::vector<X> params, SGDOptions options = {});
  void step();
  /// Parameter i's momentum buffer, in its state layout (none before its
  /// first update or without momentum).
  const std::optional<X>& momentum_buffer(std::size_t i) const { return momentum_.at(i); }

 private:
  SGDOptions options_;
  std::vector<std::optional<X>> momentum_;
};

template <Parameter X>
class AdamW : public Optimizer<X> {
 public:
  explicit AdamW(std::vector<X> params, AdamWOptions options = {});
  void step();
  /// Parameter i's first and second moments, in its state layout (none
  /// before its first update).
  const std::optional<X>& exp_avg(std::size_t i) const { return exp_avg_.at(i); }
  const std::optional<X>& exp_avg_sq(std::size_t i) const { return exp_avg_sq_.at(i); }
  /// Updates parameter i has had (its bias correction's step count).
  std::int64_t updates(std::size_t i) const { return param_steps_.at(i); }
  /// Parameter i's state as a checkpoint had it (PyTorch's
  /// load_state_dict): its moments, in its state layout on DTensors (else
  /// LayoutError naming both), of its shape and dtype (else ShapeError /
  /// DTypeError), and the updates it had. The moments are copied (the step
  /// updates its own in place). The optimizer's steps() becomes
  /// the largest updates() of its parameters.
  void load_state(std::size_t i, X exp_avg, X exp_avg_sq, std::int64_t updates);
  /// The moments by name (sharing storage with the optimizer's), for a
  /// checkpoint (dcp::save takes the map as it is): "exp_avg.<name>" and "exp_avg_sq.<name>", names[i] naming
  /// parameter i; parameters without moments yet are left out.
  std::map<std::string, X> state_dict(const std::vector<std::string>& names) const;
  /// The inverse (PyTorch's load_state_dict): every parameter's moments from
  /// `state` (as dcp::load gave them, in the state layouts), and `updates`
  /// updates each. ValueError naming a missing entry; nothing is changed then.
  void load_state_dict(const std::map<std::string, X>& state, const std::vector<std::string>& names,
                       std::int64_t updates);

 private:
  // load_state's checks (shape, dtype, state layout, updates >= 0).
  void check_state(std::size_t i, const X& exp_avg, const X& exp_avg_sq, std::int64_t updates) const;

  AdamWOptions options_;
  std::vector<std::optional<X>> exp_avg_, exp_avg_sq_;
  std::vector<std::int64_t> param_steps_;  // per parameter: bias correction counts its own updates
};

/// The p-norm (norm_type > 0, or infinity) of all the parameters'
/// gradients together, as if unsharded; where it exceeds max_norm every
/// gradient is replaced by itself times max_norm / (norm + 1e-6) (PyTorch's
/// clip_grad_norm_). Returns the norm before clipping.
///
/// On DTensors the norm takes exactly one all_reduce of one f64 over the
/// world (SUM, or MAX for infinity): each rank adds |g|^p over its shard
/// divided by the number of copies of that shard (the sizes of its
/// Replicate mesh dims), so that every element counts once whatever the
/// layout. Gradients still Partial are first reduced to their parameters'
/// layouts, as a step would: one redistribute_all per mesh (one all_reduce
/// per bucket for DDP's P(sum) -> R), in the buckets of `coalesce`, by
/// default a step's.
/// All parameters must live on meshes of one world communicator (MeshError
/// otherwise).
///
/// `across`: where other ranks hold other parameters of the same model (a
/// pipeline's stages, each on its own ranks), the communicator joining
/// them; the sum (or max) runs over it too, one more all_reduce of one f64,
/// so that every stage clips by the whole model's norm. `counted_elsewhere`:
/// indices of `params` that are clipped but not counted, since another
/// rank of `across` counts an equal gradient (a tied weight's copy on a
/// pipeline's last stage; the first stage's copy counts).
template <Parameter X>
double clip_grad_norm(std::span<const X> params, double max_norm, double norm_type = 2.0,
                      CoalesceOptions coalesce = gradient_buckets(),
                      Communicator* across = nullptr, std::span<const std::size_t> counted_elsewhere = {});

/// Linear warmup from 0 over `warmup_steps`, then a cosine from max_lr down
/// to min_lr at `total_steps` (and min_lr after): the schedule of GPT-2 and
/// llm.c. `step` counts from 0. ValueError unless 0 <= warmup <= total.
double warmup_cosine_lr(std::int64_t step, std::int64_t warmup_steps, std::int64_t total_steps, double max_lr,
                        double min_lr = 0);

}  // namespace dtensor::nn
