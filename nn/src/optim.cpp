// The optimizers' steps: gradients to their state layouts through
// redistribute_all, then one loop per parameter over its local shard (or,
// with state layouts finer than the parameter's, over the part of it those
// give this rank, written back through redistribute_all after the loop).
#include "dtensor/nn/optim.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtensor/api/autograd.h"
#include "dtensor/api/comm_tree.h"
#include "dtensor/api/pointwise.h"
#include "dtensor/core/error.h"
#include "dtensor/core/half.h"
#include "dtensor/ops/detail/vector_math.h"

namespace dtensor::nn {
namespace {

// A copy with storage of its own, cut from the graph.
Tensor owned_copy(const Tensor& t) { return t.detach().clone(); }
DTensor owned_copy(const DTensor& t) {
  const DTensor d = t.detach();
  return DTensor::from_local(d.to_local().clone(), d.mesh(), d.placements(), d.shape(), FromLocalCheck::Trust);
}

// One name per parameter, or a ValueError naming both counts.
void check_names(const std::vector<std::string>& names, std::size_t params, const char* where) {
  if (names.size() != params)
    throw ValueError(
        fmt::format("[AdamW] {}: {} names for {} parameters; expected one each", where, names.size(), params));
}

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

// The tensors of each mesh, as indices into xs and with their targets: the
// meshes in order of first appearance (the same on every rank).
struct MeshGroup {
  std::vector<std::size_t> which;
  std::vector<DTensor> tensors;
  std::vector<Layout> targets;
};
std::vector<MeshGroup> groups_by_mesh(const std::vector<DTensor>& xs, const std::vector<Layout>& to) {
  std::vector<MeshGroup> groups;
  std::vector<bool> done(xs.size(), false);
  for (std::size_t first = 0; first < xs.size(); ++first) {
    if (done[first]) continue;
    MeshGroup& g = groups.emplace_back();
    for (std::size_t j = first; j < xs.size(); ++j)
      if (!done[j] && xs[j].mesh() == xs[first].mesh()) {
        done[j] = true;
        g.which.push_back(j);
        g.tensors.push_back(xs[j]);
        g.targets.push_back(to[j]);
      }
  }
  return groups;
}

// redistribute_all over DTensors that may live on several meshes: one call
// per mesh (groups_by_mesh's order).
std::vector<DTensor> redistribute_by_mesh(const std::vector<DTensor>& xs, const std::vector<Layout>& to,
                                          const CoalesceOptions& buckets) {
  std::vector<DTensor> out(xs);
  for (const MeshGroup& g : groups_by_mesh(xs, to)) {
    std::vector<DTensor> moved = redistribute_all(g.tensors, g.targets, buckets);
    for (std::size_t k = 0; k < g.which.size(); ++k) out[g.which[k]] = std::move(moved[k]);
  }
  return out;
}

// `inner` (this rank's box under a state layout) in the coordinates of the
// parameter's shard `outer`.
Box within(const Box& inner, const Box& outer) {
  Box b = inner;
  for (int d = 0; d < b.ndim(); ++d) b.offset[d] -= outer.offset[d];
  return b;
}

// A state layout checked against its parameter (see ShardingOptions); the
// check runs over every rank's boxes, so every rank throws alike.
Layout checked_state_layout(const DTensor& p, const Layout& layout, std::size_t i, const char* who) {
  Layout state;
  try {
    state = validate_layout(layout, p.mesh().shape(), p.shape());
  } catch (const LayoutError& e) {
    throw LayoutError(fmt::format("[{}] state layout of parameter {}: {}", who, i, e.what()));
  }
  if (state.has_partial())
    throw LayoutError(
        fmt::format("[{}] state layout {} of parameter {} holds a Partial: states are values, not addends", who, state,
                    i));
  const DeviceMesh& mesh = p.mesh();
  for (int r = 0; r < static_cast<int>(mesh.size()); ++r) {
    const Shape coord = mesh.coordinate_of(r);
    const Box part = local_box(mesh.shape(), p.shape(), state, coord);
    const Box whole = local_box(mesh.shape(), p.shape(), p.placements(), coord);
    if (!contains(whole, part))
      throw LayoutError(
          fmt::format("[{}] state layout {} of parameter {} (shape {}, layout {}): rank {} would update rows it does "
                      "not hold; "
                      "a state layout must split the parameter further, nested inside its shards",
                      who, state, i, fmt::join(p.shape(), "x"), p.placements(), r));
  }
  return state;
}

}  // namespace

std::vector<Layout> zero_state_layouts(std::span<const DTensor> params, int mesh_dim) {
  std::vector<Layout> out;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Layout& l = params[i].placements();
    if (mesh_dim < 0 || mesh_dim >= l.mesh_ndim())
      throw LayoutError(fmt::format("[zero_state_layouts] mesh dim {} of parameter {} on a mesh of {} dims", mesh_dim,
                                    i, l.mesh_ndim()));
    out.push_back(params[i].dim() > 0 && is_replicate(l[mesh_dim]) ? l.with(mesh_dim, Shard{0}) : l);
  }
  return out;
}

// ---- Optimizer ---------------------------------------------------------------

template <Parameter X>
Optimizer<X>::Optimizer(std::vector<X> params, double lr, const char* name, ShardingOptions sharding)
    : params_(std::move(params)), lr_(lr), name_(name), sharding_(std::move(sharding)) {
  check_finite_non_negative(lr, "lr", name);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].requires_grad())
      throw AutogradError(
          fmt::format("[{}] parameter {} does not require a gradient: call requires_grad_() on it", name, i));
    visit_floating(params_[i].dtype(), name, [](auto, auto) {});
  }
  check_coalesce_options(sharding_.buckets, fmt::format("{}: sharding.buckets", name));
  const std::vector<Layout>& given = sharding_.state_layouts;
  if constexpr (std::same_as<X, DTensor>) {
    if (!given.empty() && given.size() != params_.size())
      throw ValueError(fmt::format("[{}] {} state layouts for {} parameters: expected one each (or none)", name,
                                   given.size(), params_.size()));
    for (std::size_t i = 0; i < params_.size(); ++i)
      state_layouts_.push_back(given.empty() ? params_[i].placements()
                                             : checked_state_layout(params_[i], given[i], i, name));
  } else if (!given.empty()) {
    throw ValueError(
        fmt::format("[{}] {} state layouts for Tensor parameters: layouts are for DTensors", name, given.size()));
  } else if (sharding_.overlap_parameter_gather) {
    throw ValueError(fmt::format("[{}] overlap_parameter_gather on Tensor parameters: it overlaps ZeRO's all_gather "
                                 "of DTensor parameters",
                                 name));
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
std::vector<std::optional<X>> Optimizer<X>::gradients_for_update() const {
  std::vector<std::optional<X>> grads(params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i) grads[i] = params_[i].grad();
  if constexpr (std::same_as<X, DTensor>) {
    NoGradGuard no_grad;
    std::vector<std::size_t> which;
    std::vector<DTensor> moving;
    std::vector<Layout> to;
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (grads[i]) {
        which.push_back(i);
        moving.push_back(*grads[i]);
        to.push_back(state_layouts_[i]);
      }
    std::vector<DTensor> moved = redistribute_by_mesh(moving, to, sharding_.buckets);
    for (std::size_t k = 0; k < which.size(); ++k) grads[which[k]] = std::move(moved[k]);
  }
  return grads;
}

template <Parameter X>
Tensor Optimizer<X>::update_shard(std::size_t i) const {
  const X& p = params_[i];
  if constexpr (std::same_as<X, DTensor>) {
    if (state_layouts_[i] != p.placements()) {
      const Box part = local_box(p.mesh().shape(), p.shape(), state_layouts_[i], p.mesh().coordinate());
      const Tensor& local = p.to_local();
      // An empty part may sit past the end of the shard (torch.chunk's offsets).
      if (part.empty()) return Tensor::empty(part.size, local.dtype(), local.device());
      return slice_box(local, within(part, p.local_box()));
    }
  }
  return local_of(p);
}

namespace detail {

// The buckets of a step's write-back, started in the order the next forward
// reads their parameters, each waited for (with every bucket started before
// it, so that every rank waits in one order) by the first read of one of its
// parameters.
struct ParameterGathers {
  struct Call {
    std::optional<StartedRedistribution> started;
    std::vector<DTensor> params;  // where its results go, in its order
  };
  std::vector<Call> calls;  // in issue order
  std::size_t waited = 0;

  ParameterGathers() = default;
  ParameterGathers(const ParameterGathers&) = delete;
  ParameterGathers& operator=(const ParameterGathers&) = delete;
  ~ParameterGathers() {
    try {
      wait_through(calls.size());
    } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw; the error surfaced at the wait
    }
  }

  /// Waits for the calls up to and including call k and writes them.
  void wait_through(std::size_t k) {
    for (; waited < calls.size() && waited <= k; ++waited) {
      Call& c = calls[waited];
      const std::vector<DTensor> whole = c.started->wait();
      for (std::size_t m = 0; m < c.params.size(); ++m) {
        on_next_read(c.params[m], nullptr);
        Tensor dst = c.params[m].to_local();  // shares the parameter's storage
        copy_into(whole[m].to_local(), dst);
      }
    }
  }
};

}  // namespace detail

template <Parameter X>
void Optimizer<X>::wait_parameters() {
  if (!gathers_) return;
  const std::shared_ptr<detail::ParameterGathers> gathers = std::move(gathers_);
  NoGradGuard no_grad;
  gathers->wait_through(gathers->calls.size());
}

template <Parameter X>
void Optimizer<X>::write_back(const std::vector<Tensor>& shards) {
  if constexpr (std::same_as<X, DTensor>) {
    NoGradGuard no_grad;
    std::vector<std::size_t> which;
    std::vector<DTensor> parts;
    std::vector<Layout> to;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const DTensor& p = params_[i];
      if (!shards[i].defined() || state_layouts_[i] == p.placements()) continue;
      which.push_back(i);
      parts.push_back(DTensor::from_local(shards[i], p.mesh(), state_layouts_[i], p.shape(), FromLocalCheck::Trust));
      to.push_back(p.placements());
    }
    if (sharding_.overlap_parameter_gather) {
      start_parameter_gathers(which, parts, to);
      return;
    }
    const std::vector<DTensor> whole = redistribute_by_mesh(parts, to, sharding_.buckets);
    for (std::size_t k = 0; k < which.size(); ++k) {
      Tensor dst = params_[which[k]].to_local();  // shares the parameter's storage
      copy_into(whole[k].to_local(), dst);
    }
  }
}

template <Parameter X>
void Optimizer<X>::start_parameter_gathers(const std::vector<std::size_t>& which, const std::vector<DTensor>& parts,
                                           const std::vector<Layout>& to) {
  if constexpr (std::same_as<X, DTensor>) {
    auto gathers = std::make_shared<detail::ParameterGathers>();
    // The calls redistribute_by_mesh makes (per mesh, in its buckets), each
    // started alone, the last first: the gradients' buckets run from the
    // last parameter, the forward reads from the first.
    std::vector<std::vector<std::size_t>> calls;  // indices into parts
    for (const MeshGroup& g : groups_by_mesh(parts, to))
      for (std::vector<std::size_t>& call : coalesced_calls(g.tensors, g.targets, sharding_.buckets)) {
        for (std::size_t& k : call) k = g.which[k];
        calls.push_back(std::move(call));
      }
    const std::weak_ptr<detail::ParameterGathers> weak = gathers;
    for (auto call = calls.rbegin(); call != calls.rend(); ++call) {
      std::vector<DTensor> xs;
      std::vector<Layout> ts;
      detail::ParameterGathers::Call started;
      for (std::size_t k : *call) {
        xs.push_back(parts[k]);
        ts.push_back(to[k]);
        started.params.push_back(params_[which[k]]);
      }
      started.started.emplace(start_redistribute_all(xs, ts, one_call()));
      const std::size_t index = gathers->calls.size();
      for (const DTensor& p : started.params)
        on_next_read(p, [weak, index] {
          if (const auto g = weak.lock()) g->wait_through(index);
        });
      gathers->calls.push_back(std::move(started));
    }
    gathers_ = std::move(gathers);
  }
}

template <Parameter X>
X Optimizer<X>::zeros_like_state(std::size_t i) const {
  const X& p = params_[i];
  NoGradGuard no_grad;
  if constexpr (std::same_as<X, DTensor>) {
    const Tensor& local = p.to_local();
    const Box part = local_box(p.mesh().shape(), p.shape(), state_layouts_[i], p.mesh().coordinate());
    return DTensor::from_local(Tensor::zeros(part.size, local.dtype(), local.device()), p.mesh(), state_layouts_[i],
                               p.shape(), FromLocalCheck::Trust);
  } else {
    return Tensor::zeros(p.shape(), p.dtype(), p.device());
  }
}

// ---- SGD ---------------------------------------------------------------------

template <Parameter X>
SGD<X>::SGD(std::vector<X> params, SGDOptions options)
    : Optimizer<X>(std::move(params), options.lr, "SGD", options.sharding),
      options_(std::move(options)),
      momentum_(this->params_.size()) {
  const SGDOptions& o = options_;
  check_finite_non_negative(o.momentum, "momentum", "SGD");
  check_finite_non_negative(o.weight_decay, "weight_decay", "SGD");
  if (!std::isfinite(o.dampening))
    throw ValueError(fmt::format("[SGD] dampening = {}; expected a finite value", o.dampening));
  if (o.nesterov && (o.momentum <= 0 || o.dampening != 0))
    throw ValueError(fmt::format("[SGD] nesterov needs momentum > 0 and dampening = 0 (got momentum {}, dampening {})",
                                 o.momentum, o.dampening));
}

template <Parameter X>
void SGD<X>::step() {
  NoGradGuard no_grad;
  CommScope phase("optimizer");
  this->wait_parameters();  // the last step's gathers not yet read
  const SGDOptions& o = options_;
  const std::vector<std::optional<X>> grads = this->gradients_for_update();
  std::vector<Tensor> shards(this->params_.size());
  for (std::size_t i = 0; i < this->params_.size(); ++i) {
    if (!grads[i]) continue;
    const bool first = o.momentum != 0 && !momentum_[i];
    if (first) momentum_[i] = this->zeros_like_state(i);
    shards[i] = this->update_shard(i);
    Tensor p = shards[i], g = local_of(*grads[i]), b = momentum_[i] ? local_of(*momentum_[i]) : Tensor();
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
  this->write_back(shards);
  ++this->steps_;
}

// ---- AdamW -------------------------------------------------------------------

template <Parameter X>
AdamW<X>::AdamW(std::vector<X> params, AdamWOptions options)
    : Optimizer<X>(std::move(params), options.lr, "AdamW", options.sharding),
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
void AdamW<X>::check_state(std::size_t i, const X& exp_avg, const X& exp_avg_sq, std::int64_t updates) const {
  const X& p = this->params_.at(i);
  for (const X* m : {&exp_avg, &exp_avg_sq}) {
    if (m->shape() != p.shape())
      throw ShapeError(fmt::format("[AdamW] load_state: a moment of shape [{}] for parameter {} of shape [{}]",
                                   fmt::join(m->shape(), ","), i, fmt::join(p.shape(), ",")));
    if (m->dtype() != p.dtype())
      throw DTypeError(fmt::format("[AdamW] load_state: a {} moment for parameter {} of {}", m->dtype(), i, p.dtype()));
    if constexpr (std::same_as<X, DTensor>)
      if (m->placements() != this->state_layout(i))
        throw LayoutError(
            fmt::format("[AdamW] load_state: a moment laid out {} for parameter {}, whose state layout "
                        "is {}",
                        m->placements(), i, this->state_layout(i)));
  }
  if (updates < 0) throw ValueError(fmt::format("[AdamW] load_state: updates = {}; expected >= 0", updates));
}

template <Parameter X>
void AdamW<X>::load_state(std::size_t i, X exp_avg, X exp_avg_sq, std::int64_t updates) {
  check_state(i, exp_avg, exp_avg_sq, updates);
  // Copies: the step updates its moments in place, and the caller's tensors
  // (another optimizer's state_dict, say) must not change with them.
  exp_avg_[i] = owned_copy(exp_avg);
  exp_avg_sq_[i] = owned_copy(exp_avg_sq);
  param_steps_[i] = updates;
  this->steps_ = std::max(this->steps_, updates);
}

template <Parameter X>
std::map<std::string, X> AdamW<X>::state_dict(const std::vector<std::string>& names) const {
  check_names(names, this->params_.size(), "state_dict");
  std::map<std::string, X> out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (!exp_avg_[i]) continue;
    out.emplace("exp_avg." + names[i], *exp_avg_[i]);
    out.emplace("exp_avg_sq." + names[i], *exp_avg_sq_[i]);
  }
  return out;
}

template <Parameter X>
void AdamW<X>::load_state_dict(const std::map<std::string, X>& state, const std::vector<std::string>& names,
                               std::int64_t updates) {
  check_names(names, this->params_.size(), "load_state_dict");
  for (const std::string& name : names)
    for (const char* prefix : {"exp_avg.", "exp_avg_sq."})
      if (!state.contains(prefix + name))
        throw ValueError(fmt::format("[AdamW] load_state_dict: no entry {}{} in the state given", prefix, name));
  for (std::size_t i = 0; i < names.size(); ++i)  // all checked before any is changed
    check_state(i, state.at("exp_avg." + names[i]), state.at("exp_avg_sq." + names[i]), updates);
  for (std::size_t i = 0; i < names.size(); ++i)
    load_state(i, state.at("exp_avg." + names[i]), state.at("exp_avg_sq." + names[i]), updates);
}

template <Parameter X>
void AdamW<X>::step() {
  NoGradGuard no_grad;
  CommScope phase("optimizer");
  this->wait_parameters();  // the last step's gathers not yet read
  const AdamWOptions& o = options_;
  const std::vector<std::optional<X>> grads = this->gradients_for_update();
  std::vector<Tensor> shards(this->params_.size());
  for (std::size_t i = 0; i < this->params_.size(); ++i) {
    if (!grads[i]) continue;
    if (!exp_avg_[i]) {
      exp_avg_[i] = this->zeros_like_state(i);
      exp_avg_sq_[i] = this->zeros_like_state(i);
    }
    const auto t_step = static_cast<double>(++param_steps_[i]);
    shards[i] = this->update_shard(i);
    Tensor p = shards[i], g = local_of(*grads[i]), m = local_of(*exp_avg_[i]), v = local_of(*exp_avg_sq_[i]);
    check_cpu(p, "AdamW");
    visit_floating(p.dtype(), "AdamW", [&](auto t, auto c) {
      using T = decltype(t);
      using C = decltype(c);
      T* pd = p.data_as<T>();
      const T* gd = g.data_as<T>();
      T* md = m.data_as<T>();
      T* vd = v.data_as<T>();
      const cpu::vmath::AdamWConstants<C> k{static_cast<C>(o.beta1),
                                            static_cast<C>(o.beta2),
                                            static_cast<C>(o.eps),
                                            static_cast<C>(1 - this->lr_ * o.weight_decay),
                                            static_cast<C>(this->lr_ / (1 - std::pow(o.beta1, t_step))),
                                            static_cast<C>(std::sqrt(1 - std::pow(o.beta2, t_step)))};
      if constexpr (std::is_same_v<T, C>) {
        cpu::vmath::adamw(k, pd, gd, md, vd, p.numel());  // f32, f64: vectorised, one pass
      } else {
        for (std::int64_t i = 0; i < p.numel(); ++i) {  // bf16, f16: computed in f32
          C pi = load<C>(pd[i]), mi = load<C>(md[i]), vi = load<C>(vd[i]);
          cpu::vmath::adamw_element(k, load<C>(gd[i]), mi, vi, pi);
          md[i] = store<T>(mi);
          vd[i] = store<T>(vi);
          pd[i] = store<T>(pi);
        }
      }
    });
  }
  this->write_back(shards);
  ++this->steps_;
}

// ---- Gradient clipping and the schedule ----------------------------------------

namespace {

// The gradients of `params` (none where absent), those still Partial reduced
// to their parameters' layouts together: one redistribute_all per mesh.
template <Parameter X>
std::vector<std::optional<X>> gradients_without_partial(std::span<const X> params, const CoalesceOptions& coalesce) {
  std::vector<std::optional<X>> grads(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) grads[i] = params[i].grad();
  if constexpr (std::same_as<X, DTensor>) {
    std::vector<std::size_t> which;
    std::vector<DTensor> partial;
    std::vector<Layout> to;
    for (std::size_t i = 0; i < params.size(); ++i)
      if (grads[i] && grads[i]->placements().has_partial()) {
        which.push_back(i);
        partial.push_back(*grads[i]);
        to.push_back(params[i].placements());
      }
    std::vector<DTensor> reduced = redistribute_by_mesh(partial, to, coalesce);
    for (std::size_t k = 0; k < which.size(); ++k) grads[which[k]] = std::move(reduced[k]);
  }
  return grads;
}

}  // namespace

template <Parameter X>
double clip_grad_norm(std::span<const X> params, double max_norm, double norm_type, CoalesceOptions coalesce,
                      Communicator* across, std::span<const std::size_t> counted_elsewhere) {
  CommScope phase("optimizer");  // its one all_reduce belongs to the update
  check_finite_non_negative(max_norm, "max_norm", "clip_grad_norm");
  if (!(norm_type > 0))
    throw ValueError(fmt::format("[clip_grad_norm] norm_type = {}; expected > 0 (or infinity)", norm_type));
  NoGradGuard no_grad;
  const bool inf = std::isinf(norm_type);
  Communicator* world = nullptr;
  if constexpr (std::same_as<X, DTensor>)
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (!params[i].grad()) continue;
      Communicator* w = &params[i].mesh().comm();
      if (world && w != world)
        throw MeshError(
            fmt::format("[clip_grad_norm] parameter {} lives on a mesh of another world communicator than parameter "
                        "0's: the norm is one all_reduce over one world",
                        i));
      world = w;
    }
  const std::vector<std::optional<X>> grads = gradients_without_partial(params, coalesce);
  double part = 0;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const std::optional<X>& g = grads[i];
    if (!g || std::ranges::find(counted_elsewhere, i) != counted_elsewhere.end()) continue;
    const double mine = local_norm_part(local_of(*g), norm_type) / (inf ? 1.0 : copies_of(*g));
    part = inf ? (std::isnan(mine) || std::isnan(part) ? mine + part : std::max(part, mine)) : part + mine;
  }
  double total = part;
  const ReduceOp combine = inf ? ReduceOp::Max : ReduceOp::Sum;
  if (world) world->all_reduce(&part, &total, 1, DType::Float64, combine);
  if (across) across->all_reduce(&total, &total, 1, DType::Float64, combine);
  const double norm = inf ? total : std::pow(total, 1.0 / norm_type);
  const double coef = max_norm / (norm + 1e-6);
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!grads[i]) continue;
    X p = params[i];
    if (coef < 1) {
      p.set_grad(*grads[i] * coef);
    } else if constexpr (std::same_as<X, DTensor>) {
      // Unclipped, the reduced gradient still replaces a Partial one, so
      // that the step does not reduce it a second time.
      if (p.grad()->placements() != grads[i]->placements()) p.set_grad(*grads[i]);
    }
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
template double clip_grad_norm<Tensor>(std::span<const Tensor>, double, double, CoalesceOptions, Communicator*,
                                       std::span<const std::size_t>);
template double clip_grad_norm<DTensor>(std::span<const DTensor>, double, double, CoalesceOptions, Communicator*,
                                        std::span<const std::size_t>);

}  // namespace dtensor::nn
