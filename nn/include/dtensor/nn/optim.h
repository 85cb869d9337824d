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
// A step first brings each gradient to its parameter's layout through the
// planner (P(sum) -> R is DDP's all_reduce, P(sum) -> S(0) a
// reduce_scatter), then updates every rank's local shard in one pass per
// parameter, with no op dispatch: the same loops as on plain tensors. The
// states (momentum, Adam's moments) live in the parameter's layout. The
// update math is PyTorch's (torch.optim.SGD, torch.optim.AdamW), computed
// in f64 for f64 parameters and in f32 otherwise.
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "dtensor/api/dtensor_tensor.h"
#include "dtensor/core/tensor.h"

namespace dtensor::nn {

template <class X>
concept Parameter = std::same_as<X, Tensor> || std::same_as<X, DTensor>;

struct SGDOptions {
  double lr = 1e-2;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;  // L2, added to the gradient (as torch.optim.SGD)
  bool nesterov = false;
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;  // decoupled: p -= lr * wd * p before the Adam step
};

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

 protected:
  Optimizer(std::vector<X> params, double lr, const char* name);
  /// Parameter i's gradient in its own layout (reduced through the planner
  /// where it is Partial or laid out otherwise); none where it has none.
  std::optional<X> gradient_in_param_layout(std::size_t i) const;
  /// A zero state in parameter i's layout.
  X zeros_like_param(std::size_t i) const;

  std::vector<X> params_;
  double lr_;
  std::int64_t steps_ = 0;
  const char* name_;
};

template <Parameter X>
class SGD : public Optimizer<X> {
 public:
  explicit SGD(std::vector<X> params, SGDOptions options = {});
  void step();
  /// Parameter i's momentum buffer, in its layout (none before its first
  /// update or without momentum).
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
  /// Parameter i's first and second moments, in its layout (none before
  /// its first update).
  const std::optional<X>& exp_avg(std::size_t i) const { return exp_avg_.at(i); }
  const std::optional<X>& exp_avg_sq(std::size_t i) const { return exp_avg_sq_.at(i); }

 private:
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
/// layout. A gradient still Partial is first reduced to its parameter's
/// layout (one more collective each), as a step would. All parameters must
/// live on meshes of one world communicator (MeshError otherwise).
template <Parameter X>
double clip_grad_norm(std::span<const X> params, double max_norm, double norm_type = 2.0);

/// Linear warmup from 0 over `warmup_steps`, then a cosine from max_lr down
/// to min_lr at `total_steps` (and min_lr after): the schedule of GPT-2 and
/// llm.c. `step` counts from 0. ValueError unless 0 <= warmup <= total.
double warmup_cosine_lr(std::int64_t step, std::int64_t warmup_steps, std::int64_t total_steps, double max_lr,
                        double min_lr = 0);

}  // namespace dtensor::nn
