// The optimizers' steps: gradients to the parameters' layouts through the
// planner, then one loop per parameter over its local shard.
#include "dtensor/nn/optim.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "dtensor/api/autograd.h"
#include "dtensor/api/pointwise.h"
#include "dtensor/core/error.h"
#include "dtensor/core/half.h"

namespace dtensor::nn {
namespace {

// The shard an update writes into (shares the parameter's storage).
Tensor local_of(const Tensor& t) { return t; }
Tensor local_of(const DTensor& t) { return t.to_local(); }

void check_cpu(const Tensor& local, const char* who) {
  if (local.device() != Device::CPU)
    throw DeviceError(
        fmt::format("[{}] a parameter's shard is on {}: the optimizers update CPU shards only", who, local.device()));
}

// Calls fn(T{}, C{}) with T the storage type of a floating dtype and C the
// type the update computes in (f64 for f64, f32 otherwise, as PyTorch).
template <class Fn>
void visit_floating(DType dtype, const char* who, Fn&& fn) {
  switch (dtype) {
    case DType::Float64: fn(double{}, double{}); return;
    case DType::Float32: fn(float{}, float{}); return;
    case DType::BFloat16: fn(bfloat16{}, float{}); return;
    case DType::Float16: fn(float16{}, float{}); return;
    default:
      throw DTypeError(
          fmt::format("[{}] a {} parameter: optimizers update floating-point parameters only", who, dtype_name(dtype)));
  }
}

template <class C, class T>
C load(const T& v) {
  return static_cast<C>(v);
}
template <class T, class C>
T store(C v) {
  return T(v);
}

void check_finite_non_negative(double v, const char* what, const char* who) {
  if (!std::isfinite(v) || v < 0)
    throw ValueError(fmt::format("[{}] {} = {}; expected a finite value >= 0", who, what, v));
}

// Copies of each shard: the sizes of the mesh dims a layout replicates over.
double copies_of(const DTensor& g) {
  double n = 1;
  for (int m = 0; m < g.placements().mesh_ndim(); ++m)
    if (is_replicate(g.placements()[m])) n *= static_cast<double>(g.mesh().size(m));
  return n;
}
double copies_of(const Tensor&) { return 1; }

// sum |x|^p (or max |x| for p = inf) over a shard, in f64.
double local_norm_part(const Tensor& local, double p) {
  double acc = 0;
  visit_floating(local.dtype(), "clip_grad_norm", [&](auto t, auto) {
    using T = decltype(t);
    const T* x = local.data_as<T>();
    for (std::int64_t i = 0; i < local.numel(); ++i) {
      const double a = std::abs(static_cast<double>(x[i]));
      if (std::isinf(p))
        acc = std::isnan(a) || std::isnan(acc) ? std::numeric_limits<double>::quiet_NaN() : std::max(acc, a);
      else
        acc += p == 2 ? a * a : std::pow(a, p);
    }
  });
  return acc;
}

}  // namespace

// ---- Optimizer ---------------------------------------------------------------

template <Parameter X>
Optimizer<X>::Optimizer(std::vector<X> params, double lr, const char* name)
    : params_(std::move(params)), lr_(lr), name_(name) {
  check_finite_non_negative(lr, "lr", name);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].requires_grad())
      throw AutogradError(
          fmt::format("[{}] parameter {} does not require a gradient: call requires_grad_() on it", name, i));
    visit_floating(params_[i].dtype(), name, [](auto, auto) {});
  }
}

template <Parameter X>
void Optimizer<X>::set_lr(double lr) {
  check_finite_non_negative(lr, "lr", name_);
  lr_ = lr;
}

template <Parameter X>
void Optimizer<X>::zero_grad() {
  for (X& p : params_) p.zero_grad();
}

template <Parameter X>
std::optional<X> Optimizer<X>::gradient_in_param_layout(std::size_t i) const {
  const X& p = params_[i];
  std::optional<X> g = p.grad();
  if (!g) return std::nullopt;
  if constexpr (std::same_as<X, DTensor>) {
    if (g->placements() != p.placements()) {
      NoGradGuard no_grad;
      return g->redistribute(p.placements());
    }
  }
  return *g;
}

template <Parameter X>
X Optimizer<X>::zeros_like_param(std::size_t i) const {
  const X& p = params_[i];
  NoGradGuard no_grad;
  if constexpr (std::same_as<X, DTensor>) {
    const Tensor& local = p.to_local();
    return DTensor::from_local(Tensor::zeros(local.shape(), local.dtype(), local.device()), p.mesh(), p.placements(),
                               p.shape(), FromLocalCheck::Trust);
  } else {
    return Tensor::zeros(p.shape(), p.dtype(), p.device());
  }
}

// ---- SGD ---------------------------------------------------------------------

template <Parameter X>
SGD<X>::SGD(std::vector<X> params, SGDOptions options)
    : Optimizer<X>(std::move(params), options.lr, "SGD"), options_(options), momentum_(this->params_.size()) {
  check_finite_non_negative(options.momentum, "momentum", "SGD");
  check_finite_non_negative(options.weight_decay, "weight_decay", "SGD");
  if (!std::isfinite(options.dampening))
    throw ValueError(fmt::format("[SGD] dampening = {}; expected a finite value", options.dampening));
  if (options.nesterov && (options.momentum <= 0 || options.dampening != 0))
    throw ValueError(fmt::format("[SGD] nesterov needs momentum > 0 and dampening = 0 (got momentum {}, dampening {})",
                                 options.momentum, options.dampening));
}

template <Parameter X>
void SGD<X>::step() {
  NoGradGuard no_grad;
  const SGDOptions o = options_;
  for (std::size_t i = 0; i < this->params_.size(); ++i) {
    const std::optional<X> grad = this->gradient_in_param_layout(i);
    if (!grad) continue;
    const bool first = o.momentum != 0 && !momentum_[i];
    if (first) momentum_[i] = this->zeros_like_param(i);
    Tensor p = local_of(this->params_[i]), g = local_of(*grad), b = momentum_[i] ? local_of(*momentum_[i]) : Tensor();
    check_cpu(p, "SGD");
    visit_floating(p.dtype(), "SGD", [&](auto t, auto c) {
      using T = decltype(t);
      using C = decltype(c);
      T* pd = p.data_as<T>();
      const T* gd = g.data_as<T>();
      T* bd = o.momentum != 0 ? b.data_as<T>() : nullptr;
      const C lr = static_cast<C>(this->lr_), wd = static_cast<C>(o.weight_decay), mu = static_cast<C>(o.momentum),
              keep = static_cast<C>(1 - o.dampening);
      for (std::int64_t k = 0; k < p.numel(); ++k) {
        const C pk = load<C>(pd[k]);
        C d = load<C>(gd[k]) + wd * pk;
        if (bd) {
          const C buf = first ? d : mu * load<C>(bd[k]) + keep * d;
          bd[k] = store<T>(buf);
          d = o.nesterov ? d + mu * buf : buf;
        }
        pd[k] = store<T>(pk - lr * d);
      }
    });
  }
  ++this->steps_;
}

// ---- AdamW -------------------------------------------------------------------

template <Parameter X>
AdamW<X>::AdamW(std::vector<X> params, AdamWOptions options)
    : Optimizer<X>(std::move(params), options.lr, "AdamW"),
      options_(options),
      exp_avg_(this->params_.size()),
      exp_avg_sq_(this->params_.size()),
      param_steps_(this->params_.size(), 0) {
  for (const auto& [v, what] : {std::pair{options.beta1, "beta1"}, std::pair{options.beta2, "beta2"}})
    if (!(v >= 0 && v < 1)) throw ValueError(fmt::format("[AdamW] {} = {}; expected 0 <= {} < 1", what, v, what));
  check_finite_non_negative(options.eps, "eps", "AdamW");
  check_finite_non_negative(options.weight_decay, "weight_decay", "AdamW");
}

template <Parameter X>
void AdamW<X>::step() {
  NoGradGuard no_grad;
  const AdamWOptions o = options_;
  for (std::size_t i = 0; i < this->params_.size(); ++i) {
    const std::optional<X> grad = this->gradient_in_param_layout(i);
    if (!grad) continue;
    if (!exp_avg_[i]) {
      exp_avg_[i] = this->zeros_like_param(i);
      exp_avg_sq_[i] = this->zeros_like_param(i);
    }
    const auto t_step = static_cast<double>(++param_steps_[i]);
    Tensor p = local_of(this->params_[i]), g = local_of(*grad), m = local_of(*exp_avg_[i]),
           v = local_of(*exp_avg_sq_[i]);
    check_cpu(p, "AdamW");
    visit_floating(p.dtype(), "AdamW", [&](auto t, auto c) {
      using T = decltype(t);
      using C = decltype(c);
      T* pd = p.data_as<T>();
      const T* gd = g.data_as<T>();
      T* md = m.data_as<T>();
      T* vd = v.data_as<T>();
      const C b1 = static_cast<C>(o.beta1), b2 = static_cast<C>(o.beta2), eps = static_cast<C>(o.eps);
      const C decay = static_cast<C>(1 - this->lr_ * o.weight_decay);
      const C step_size = static_cast<C>(this->lr_ / (1 - std::pow(o.beta1, t_step)));
      const C bc2_sqrt = static_cast<C>(std::sqrt(1 - std::pow(o.beta2, t_step)));
      for (std::int64_t k = 0; k < p.numel(); ++k) {
        const C gk = load<C>(gd[k]);
        const C mk = b1 * load<C>(md[k]) + (1 - b1) * gk;
        const C vk = b2 * load<C>(vd[k]) + (1 - b2) * gk * gk;
        md[k] = store<T>(mk);
        vd[k] = store<T>(vk);
        const C denom = std::sqrt(vk) / bc2_sqrt + eps;
        pd[k] = store<T>(load<C>(pd[k]) * decay - step_size * mk / denom);
      }
    });
  }
  ++this->steps_;
}

// ---- Gradient clipping and the schedule ----------------------------------------

template <Parameter X>
double clip_grad_norm(std::span<const X> params, double max_norm, double norm_type) {
  check_finite_non_negative(max_norm, "max_norm", "clip_grad_norm");
  if (!(norm_type > 0))
    throw ValueError(fmt::format("[clip_grad_norm] norm_type = {}; expected > 0 (or infinity)", norm_type));
  NoGradGuard no_grad;
  const bool inf = std::isinf(norm_type);
  std::vector<std::optional<X>> grads(params.size());
  double part = 0;
  Communicator* world = nullptr;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const X& p = params[i];
    std::optional<X> g = p.grad();
    if (!g) continue;
    if constexpr (std::same_as<X, DTensor>) {
      Communicator* w = &p.mesh().comm();
      if (world && w != world)
        throw MeshError(
            fmt::format("[clip_grad_norm] parameter {} lives on a mesh of another world communicator than parameter "
                        "0's: the "
                        "norm is one all_reduce over one world",
                        i));
      world = w;
      if (g->placements().has_partial()) g = g->redistribute(p.placements());
    }
    grads[i] = g;
    const double mine = local_norm_part(local_of(*g), norm_type) / (inf ? 1.0 : copies_of(*g));
    part = inf ? (std::isnan(mine) || std::isnan(part) ? mine + part : std::max(part, mine)) : part + mine;
  }
  double total = part;
  if (world) world->all_reduce(&part, &total, 1, DType::Float64, inf ? ReduceOp::Max : ReduceOp::Sum);
  const double norm = inf ? total : std::pow(total, 1.0 / norm_type);
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1)
    for (std::size_t i = 0; i < params.size(); ++i)
      if (grads[i]) {
        X p = params[i];
        p.set_grad(*grads[i] * coef);
      }
  return norm;
}

double warmup_cosine_lr(std::int64_t step, std::int64_t warmup_steps, std::int64_t total_steps, double max_lr,
                        double min_lr) {
  if (warmup_steps < 0 || warmup_steps > total_steps || step < 0)
    throw ValueError(
        fmt::format("[warmup_cosine_lr] step {}, warmup_steps {}, total_steps {}: expected 0 <= step and "
                    "0 <= warmup_steps <= total_steps",
                    step, warmup_steps, total_steps));
  if (step < warmup_steps) return max_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (step >= total_steps) return min_lr;
  const double progress = static_cast<double>(step - warmup_steps) /
                          static_cast<double>(std::max<std::int64_t>(1, total_steps - warmup_steps));
  return min_lr + 0.5 * (max_lr - min_lr) * (1 + std::cos(M_PI * progress));
}

template class Optimizer<Tensor>;
template class Optimizer<DTensor>;
template class SGD<Tensor>;
template class SGD<DTensor>;
template class AdamW<Tensor>;
template class AdamW<DTensor>;
template double clip_grad_norm<Tensor>(std::span<const Tensor>, double, double);
template double clip_grad_norm<DTensor>(std::span<const DTensor>, double, double);

}  // namespace dtensor::nn
