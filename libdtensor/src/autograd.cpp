// The autograd engine: grad mode, the rule table, op recording, backward.
#include <atomic>
#include <mutex>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "dtensor/api/comm_tree.h"
#include "dtensor/api/functional.h"
#include "dtensor/core/error.h"
#include "autograd_engine.h"

namespace dtensor {

namespace detail {
struct AutogradAccess {
  static std::shared_ptr<AutogradMeta>& meta(DTensor& t) { return t.autograd_; }
  static Tensor& local(const DTensor& t) { return t.local_; }
};
}  // namespace detail

namespace {

thread_local bool grad_mode = true;
thread_local std::uint64_t next_sequence = 0;

// ---- The rule table ----------------------------------------------------------

struct RuleTable {
  std::mutex mutex;
  std::unordered_map<const OpDef*, std::shared_ptr<const BackwardRule>> rules;
  std::unordered_set<const OpDef*> not_differentiable;  // immutable once made
};

RuleTable& rule_table() {
  static RuleTable* table = [] {
    auto* t = new RuleTable;  // never destroyed: rank threads may outlive statics
    for (auto& [name, rule] : builtin_backward_rules()) t->rules[&Op::find(name).def()] = rule;
    for (auto name : builtin_not_differentiable()) t->not_differentiable.insert(&Op::find(name).def());
    return t;
  }();
  return *table;
}

// ---- Nodes -------------------------------------------------------------------

// A recorded call_op: the op, its attrs, detached copies of its inputs and
// output. The rule is looked up when the gradient arrives, so that a
// missing one fails only then.
template <class X>
class OpNode final : public Node {
 public:
  OpNode(const OpDef& op, const OpAttrs& attrs) : op_(&op), attrs_(attrs) {}
  std::string name() const override { return op_->name; }
  // Two in place: with three DTensors (216 bytes each) the node outgrew
  // glibc's per-thread cache of small blocks (1032 bytes) and its malloc
  // took the slow path; a third input (linear_bias, where) spills.
  NodeSlots<X, 2> inputs;
  std::optional<X> output;

  std::vector<std::optional<AnyTensor>> apply(const AnyTensor& grad) override { return run_rule(grad, nullptr); }
  bool splits_edges() const override { return true; }
  std::vector<std::optional<AnyTensor>> apply_edges(const AnyTensor& grad, const std::vector<bool>& wanted) override {
    return run_rule(grad, &wanted);
  }
  void release() override {
    inputs.clear();
    output.reset();
    released = true;
  }

 private:
  // The rule's gradients of the inputs with an edge, and of those only
  // that `wanted` marks where it is given (a split backward's half). A
  // whole backward passes none: no mask is built on every node.
  std::vector<std::optional<AnyTensor>> run_rule(const AnyTensor& grad, const std::vector<bool>* wanted) {
    const auto rule = backward_rule(*op_);
    if (!rule)
      throw AutogradError(
          fmt::format("[backward] op '{}' has no backward rule, and a gradient has to pass through it: give it one "
                      "(OpDef::backward = make_backward(...), or set_backward) or detach() its inputs",
                      op_->name));
    const X& g = std::get<X>(grad);
    // Which inputs need a gradient: those with an edge (made here, not at
    // recording, which stays one allocation cheaper on every op).
    std::vector<bool> needs(edges.size());
    for (std::size_t i = 0; i < edges.size(); ++i)
      needs[i] = (edges[i].fn || edges[i].leaf) && (!wanted || (*wanted)[i]);
    BackwardArgs<X> args{attrs_, inputs, *output, g, needs};
    InputGrads<X> got;
    {
      ExplainTag tag(fmt::format("backward of {}", op_->name));
      if constexpr (std::same_as<X, Tensor>)
        got = rule->on_tensor(args);
      else
        got = rule->on_dtensor(args);
    }
    std::vector<std::optional<AnyTensor>> out(edges.size());
    for (std::size_t i = 0; i < edges.size() && i < got.size(); ++i) {
      if (!needs[i] || !got[i]) continue;
      if (got[i]->shape() != inputs[i].shape())
        throw Error(
            fmt::format("[backward] internal: the rule of '{}' gave input {} a gradient of shape {} for a "
                        "{} input",
                        op_->name, i, fmt::join(got[i]->shape(), "x"), fmt::join(inputs[i].shape(), "x")));
      out[i] = std::move(*got[i]);
    }
    return out;
  }

  const OpDef* op_;
  OpAttrs attrs_;
};

// Hooks registered by on_gradient_ready, ever: while there are none, a
// backward counts no leaf edges.
std::atomic<std::uint64_t> hooked_leaves{0};

// How many edges of the graph below `top` (its nodes: `top` and the keys of
// `deps`) lead to each leaf that has hooks.
std::unordered_map<AutogradMeta*, int> hooked_leaf_edges(Node* top, const std::unordered_map<Node*, int>& deps) {
  std::unordered_map<AutogradMeta*, int> out;
  auto count = [&](const Node* n) {
    for (const Edge& e : n->edges)
      if (e.leaf && !e.leaf->grad_ready_hooks.empty()) ++out[e.leaf.get()];
  };
  count(top);
  for (const auto& [n, unused] : deps) count(n);
  return out;
}

// A leaf's hooks, once its gradient for this backward is complete (none
// when no gradient reached it).
void run_grad_ready_hooks(const AutogradMeta& leaf) {
  if (!leaf.grad) return;
  for (const auto& [id, hook] : leaf.grad_ready_hooks) hook();
}

// Runs the graph below `root` with `grad` as its output's gradient.
void run_backward(const std::shared_ptr<AutogradMeta>& root, const AnyTensor& grad, bool retain_graph) {
  CommScope phase("backward");  // a CommTree recording counts the backward on its own
  if (!in_graph(root))
    throw AutogradError(
        "[backward] the tensor does not require a gradient: none of the inputs of the ops that made it requires one "
        "(call requires_grad_() on a leaf), or it came from a non-differentiable op, detach() or a NoGradGuard");
  NoGradGuard no_grad;
  if (!root->grad_fn) {
    accumulate(*root, grad);
    run_grad_ready_hooks(*root);
    return;
  }
  Node* const top = root->grad_fn.get();
  std::unordered_map<Node*, int> deps = incoming_edges({&top, 1});
  // The hooked leaves' edges in this graph: a leaf's gradient is complete
  // when the last of them has been followed.
  std::unordered_map<AutogradMeta*, int> leaf_edges;
  if (hooked_leaves.load(std::memory_order_relaxed) > 0) leaf_edges = hooked_leaf_edges(top, deps);
  std::unordered_map<Node*, AnyTensor> pending;
  pending.emplace(top, grad);
  std::priority_queue<Node*, std::vector<Node*>, Later> ready;
  ready.push(top);
  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    std::vector<std::optional<AnyTensor>> grads(n->edges.size());
    if (auto it = pending.find(n); it != pending.end()) {
      grads = n->apply(it->second);
      pending.erase(it);
    } else {
      grads = n->apply_collected();
    }
    for (std::size_t i = 0; i < n->edges.size(); ++i) {
      const Edge& e = n->edges[i];
      if (e.fn) {
        if (i < grads.size() && grads[i]) {
          auto [it, fresh] = pending.try_emplace(e.fn.get(), *grads[i]);
          if (!fresh) it->second = add_grads(it->second, *grads[i]);
        }
        if (--deps[e.fn.get()] == 0) ready.push(e.fn.get());
      } else if (e.leaf) {
        if (i < grads.size() && grads[i]) accumulate(*e.leaf, *grads[i]);
        if (auto it = leaf_edges.find(e.leaf.get()); it != leaf_edges.end() && --it->second == 0)
          run_grad_ready_hooks(*e.leaf);
      }
    }
    if (!retain_graph) n->release();
  }
}

template <class X>
void check_requires_grad_dtype(const X& x, bool on) {
  if (on && !is_floating(x.dtype()))
    throw DTypeError(
        fmt::format("[requires_grad_] a {} tensor cannot require a gradient; expected a floating dtype (f32, f64, "
                    "bf16, f16)",
                    x.dtype()));
}

void set_requires_grad(std::shared_ptr<AutogradMeta>& meta, bool on) {
  if (meta && meta->grad_fn) {
    if (!on)
      throw ValueError(
          "[requires_grad_] requires_grad_(false) on a tensor an op made: only leaves can stop requiring a gradient; "
          "use detach()");
    return;
  }
  if (!meta) {
    if (!on) return;
    meta = std::make_shared<AutogradMeta>();
  }
  meta->requires_grad = on;
}

void check_settable_grad(const std::shared_ptr<AutogradMeta>& meta, std::string_view kind) {
  if (!meta || !meta->requires_grad || meta->grad_fn)
    throw AutogradError(
        fmt::format("[set_grad] this {} is not a leaf that requires a gradient ({}): call requires_grad_() on a leaf "
                    "first",
                    kind, meta && meta->grad_fn ? "an op made it" : "requires_grad() is false"));
}

void check_grad_matches(const Shape& shape, DType dtype, const Shape& grad_shape, DType grad_dtype) {
  if (shape != grad_shape)
    throw ShapeError(fmt::format("[set_grad] a gradient of shape {} for a tensor of shape {}; expected the same",
                                 fmt::join(grad_shape, "x"), fmt::join(shape, "x")));
  if (dtype != grad_dtype)
    throw DTypeError(
        fmt::format("[set_grad] a {} gradient for a {} tensor; expected the same dtype", grad_dtype, dtype));
}

// Strips a DTensor's records, its own and its shard's.
DTensor strip(DTensor t) {
  detail::AutogradAccess::meta(t).reset();
  Tensor& local = detail::AutogradAccess::local(t);
  if (local.autograd_meta()) local.set_autograd_meta(nullptr);
  return t;
}

}  // namespace

// ---- Grad mode and rules -----------------------------------------------------------

bool grad_enabled() { return grad_mode; }
NoGradGuard::NoGradGuard() : previous_(grad_mode) { grad_mode = false; }
NoGradGuard::~NoGradGuard() { grad_mode = previous_; }
EnableGradGuard::EnableGradGuard() : previous_(grad_mode) { grad_mode = true; }
EnableGradGuard::~EnableGradGuard() { grad_mode = previous_; }

void set_backward(Op op, std::shared_ptr<const BackwardRule> rule) {
  RuleTable& t = rule_table();
  std::lock_guard lock(t.mutex);
  t.rules[&op.def()] = std::move(rule);
}

std::shared_ptr<const BackwardRule> backward_rule(const OpDef& op) {
  RuleTable& t = rule_table();
  std::lock_guard lock(t.mutex);
  if (auto it = t.rules.find(&op); it != t.rules.end()) return it->second;
  return op.backward;
}

bool is_not_differentiable(const OpDef& op) {
  if (op.not_differentiable) return true;
  // The set is filled once, when the table is made, and never changes (only
  // the rules do): read without the mutex, which every rank thread's
  // recording would otherwise take on every op.
  return rule_table().not_differentiable.count(&op) != 0;
}

// ---- Graph plumbing --------------------------------------------------------------

AnyTensor add_grads(const AnyTensor& a, const AnyTensor& b) {
  if (a.index() != b.index()) throw Error("[backward] internal: a Tensor and a DTensor gradient for one tensor");
  if (const Tensor* t = std::get_if<Tensor>(&a)) return call_op_on(registered_op<"add">(), {}, *t, std::get<Tensor>(b));
  return call_op_on(registered_op<"add">(), {}, std::get<DTensor>(a), std::get<DTensor>(b));
}

namespace {
AnyTensor detached_any(const AnyTensor& g) {
  return std::visit([](const auto& t) -> AnyTensor { return detached(t); }, g);
}
}  // namespace

void accumulate(AutogradMeta& leaf, const AnyTensor& grad) {
  leaf.grad = leaf.grad ? add_grads(*leaf.grad, grad) : detached_any(grad);
}

void check_grad_shape(const Shape& shape, const Shape& grad) {
  if (shape != grad)
    throw ShapeError(fmt::format("[backward] grad_output of shape {} for a tensor of shape {}; expected the same",
                                 fmt::join(grad, "x"), fmt::join(shape, "x")));
}

void check_scalar(const Shape& shape) {
  if (!shape.empty())
    throw ValueError(
        fmt::format("[backward] backward() without a gradient needs a 0-d tensor; this one has shape {}: pass "
                    "grad_output",
                    fmt::join(shape, "x")));
}

Tensor unit_gradient(const Tensor& loss) {
  check_scalar(loss.shape());
  return Tensor::ones({}, loss.dtype(), loss.device());
}
DTensor unit_gradient(const DTensor& loss) {
  check_scalar(loss.shape());
  // The gradient of a 0-d loss is one on every rank: Replicate (a Partial
  // loss's pieces each get the whole gradient).
  return DTensor::from_local(Tensor::ones({}, loss.dtype(), loss.mesh().device()), loss.mesh(),
                             Layout::replicated(loss.mesh().ndim()), Shape{}, FromLocalCheck::Trust)
      .with_cost_model(loss.cost_model());
}

void throw_freed_graph(const Node& node) {
  throw AutogradError(
      fmt::format("[backward] the graph through '{}' was freed by an earlier backward; pass retain_graph = true to the "
                  "first backward to run another through it",
                  node.name()));
}

std::unordered_map<Node*, int> incoming_edges(std::span<Node* const> roots) {
  std::unordered_map<Node*, int> deps;
  std::vector<Node*> stack(roots.begin(), roots.end());
  std::unordered_set<Node*> seen(roots.begin(), roots.end());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    if (n->released) throw_freed_graph(*n);
    for (const Edge& e : n->edges) {
      if (!e.fn) continue;
      ++deps[e.fn.get()];
      if (seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
    }
  }
  return deps;
}

Node::Node() : sequence(next_sequence++) {}

Edge edge_of(const std::shared_ptr<AutogradMeta>& meta) {
  if (!in_graph(meta)) return {};
  if (meta->grad_fn) return Edge{meta->grad_fn, nullptr};
  return Edge{nullptr, meta};
}

Tensor detached(const Tensor& t) {
  Tensor out = t;
  if (out.autograd_meta()) out.set_autograd_meta(nullptr);
  return out;
}
DTensor detached(const DTensor& t) { return strip(t); }

void attach(Tensor& out, std::shared_ptr<Node> node) {
  auto meta = std::make_shared<AutogradMeta>();
  meta->grad_fn = std::move(node);
  out.set_autograd_meta(std::move(meta));
}
void attach(DTensor& out, std::shared_ptr<Node> node) {
  out = strip(std::move(out));
  auto meta = std::make_shared<AutogradMeta>();
  meta->grad_fn = std::move(node);
  detail::AutogradAccess::meta(out) = std::move(meta);
}

std::vector<std::optional<AnyTensor>> GroupNode::apply_collected() {
  std::vector<std::optional<AnyTensor>> arrived(arrived_.size());
  arrived.swap(arrived_);  // the next backward (retain_graph) collects afresh
  return backward(std::move(arrived));
}

namespace {

class GroupPart final : public Node {
 public:
  GroupPart(const std::shared_ptr<GroupNode>& group, std::size_t k) : group_(group.get()), k_(k) {
    edges.push_back(Edge{group, nullptr});
  }
  std::string name() const override { return group_->name(); }
  std::vector<std::optional<AnyTensor>> apply(const AnyTensor& grad) override {
    group_->receive(k_, grad);
    return {};
  }
  void release() override { released = true; }

 private:
  GroupNode* group_;  // owned through the edge
  std::size_t k_;
};

}  // namespace

void attach_part(Tensor& out, const std::shared_ptr<GroupNode>& group, std::size_t k) {
  attach(out, std::make_shared<GroupPart>(group, k));
}
void attach_part(DTensor& out, const std::shared_ptr<GroupNode>& group, std::size_t k) {
  attach(out, std::make_shared<GroupPart>(group, k));
}

void record_op(const OpDef& op, const OpAttrs& attrs, std::span<const Tensor> inputs, Tensor& out) {
  if (out.autograd_meta()) out.set_autograd_meta(nullptr);  // a kernel may hand an input back
  if (!grad_mode) return;
  bool any = false;
  for (const Tensor& x : inputs) any = any || in_graph(x.autograd_meta());
  if (!any || is_not_differentiable(op) || !is_floating(out.dtype())) return;
  auto node = std::make_shared<OpNode<Tensor>>(op, attrs);
  node->inputs.reserve(inputs.size());
  node->edges.reserve(inputs.size());
  for (const Tensor& x : inputs) {
    node->edges.push_back(edge_of(x.autograd_meta()));
    node->inputs.push_back(detached(x));
  }
  node->output = detached(out);
  attach(out, std::move(node));
}

bool records(const OpDef& op, std::span<const DTensor* const> inputs) {
  if (!grad_mode) return false;
  bool any = false;
  for (const DTensor* x : inputs) any = any || in_graph(x->autograd_meta());
  return any && !is_not_differentiable(op);
}

void record_op(const OpDef& op, const OpAttrs& attrs, std::span<const DTensor* const> inputs, DTensor& out,
               std::span<const std::optional<DTensor>> as_used) {
  if (!is_floating(out.dtype())) return;  // an integer output has no gradient to carry
  auto node = std::make_shared<OpNode<DTensor>>(op, attrs);
  node->inputs.reserve(inputs.size());
  node->edges.reserve(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const DTensor& x = *inputs[i];
    node->edges.push_back(edge_of(x.autograd_meta()));
    node->inputs.push_back(i < as_used.size() && as_used[i] ? *as_used[i] : strip(x));
  }
  node->output = strip(out);
  attach(out, std::move(node));
}

// ---- The public members ------------------------------------------------------------

Tensor& Tensor::requires_grad_(bool on) {
  check_requires_grad_dtype(*this, on);
  set_requires_grad(autograd_, on);
  return *this;
}
bool Tensor::requires_grad() const { return in_graph(autograd_); }
std::optional<Tensor> Tensor::grad() const {
  if (!autograd_ || !autograd_->grad) return std::nullopt;
  return std::get<Tensor>(*autograd_->grad);
}
void Tensor::zero_grad() {
  if (autograd_) autograd_->grad.reset();
}
namespace {
GradientReadyHook add_hook(const std::shared_ptr<AutogradMeta>& meta, std::string_view kind,
                           std::function<void()> hook) {
  if (!meta || !meta->requires_grad || meta->grad_fn)
    throw AutogradError(fmt::format(
        "[on_gradient_ready] this {} is not a leaf that requires a gradient ({}): hooks go on leaves, such as "
        "parameters",
        kind, meta && meta->grad_fn ? "an op made it" : "requires_grad() is false"));
  const std::uint64_t id = hooked_leaves.fetch_add(1, std::memory_order_relaxed) + 1;
  meta->grad_ready_hooks.emplace_back(id, std::move(hook));
  return GradientReadyHook(meta, id);
}
}  // namespace

GradientReadyHook on_gradient_ready(const Tensor& leaf, std::function<void()> hook) {
  return add_hook(leaf.autograd_meta(), "Tensor", std::move(hook));
}
GradientReadyHook on_gradient_ready(const DTensor& leaf, std::function<void()> hook) {
  return add_hook(leaf.autograd_meta(), "DTensor", std::move(hook));
}

void on_next_read(const DTensor& leaf, std::function<void()> hook) {
  const std::shared_ptr<AutogradMeta>& meta = leaf.autograd_meta();
  if (!meta || !meta->requires_grad || meta->grad_fn)
    throw AutogradError(fmt::format(
        "[on_next_read] this DTensor is not a leaf that requires a gradient ({}): read hooks go on parameters",
        meta && meta->grad_fn ? "an op made it" : "requires_grad() is false"));
  meta->before_read = std::move(hook);
}

GradientReadyHook::GradientReadyHook(std::weak_ptr<AutogradMeta> leaf, std::uint64_t id)
    : leaf_(std::move(leaf)), id_(id) {}
GradientReadyHook::GradientReadyHook(GradientReadyHook&& other) noexcept
    : leaf_(std::move(other.leaf_)), id_(std::exchange(other.id_, 0)) {}
GradientReadyHook& GradientReadyHook::operator=(GradientReadyHook&& other) noexcept {
  if (this != &other) {
    remove();
    leaf_ = std::move(other.leaf_);
    id_ = std::exchange(other.id_, 0);
  }
  return *this;
}
GradientReadyHook::~GradientReadyHook() { remove(); }
void GradientReadyHook::remove() noexcept {
  if (id_ == 0) return;
  if (auto meta = leaf_.lock())
    std::erase_if(meta->grad_ready_hooks, [this](const auto& entry) { return entry.first == id_; });
  id_ = 0;
}

void Tensor::set_grad(const Tensor& grad) {
  check_settable_grad(autograd_, "Tensor");
  check_grad_matches(shape(), dtype(), grad.shape(), grad.dtype());
  autograd_->grad = detached(grad);
}
void Tensor::backward(bool retain_graph) const { run_backward(autograd_, unit_gradient(*this), retain_graph); }
void Tensor::backward(const Tensor& grad_output, bool retain_graph) const {
  check_grad_shape(shape(), grad_output.shape());
  run_backward(autograd_, detached(grad_output), retain_graph);
}
Tensor Tensor::detach() const { return detached(*this); }

DTensor& DTensor::requires_grad_(bool on) {
  check_requires_grad_dtype(*this, on);
  set_requires_grad(autograd_, on);
  return *this;
}
bool DTensor::requires_grad() const { return in_graph(autograd_); }
std::optional<DTensor> DTensor::grad() const {
  if (!autograd_ || !autograd_->grad) return std::nullopt;
  return std::get<DTensor>(*autograd_->grad);
}
void DTensor::zero_grad() {
  if (autograd_) autograd_->grad.reset();
}
void DTensor::set_grad(const DTensor& grad) {
  check_settable_grad(autograd_, "DTensor");
  if (!(grad.mesh() == mesh()))
    throw MeshError(fmt::format("[set_grad] a gradient on mesh {} for a DTensor on mesh {}; expected the same mesh",
                                grad.mesh(), mesh()));
  check_grad_matches(shape(), dtype(), grad.shape(), grad.dtype());
  autograd_->grad = strip(grad);
}
void DTensor::backward(bool retain_graph) const { run_backward(autograd_, unit_gradient(*this), retain_graph); }
void DTensor::backward(const DTensor& grad_output, bool retain_graph) const {
  check_grad_shape(shape(), grad_output.shape());
  run_backward(autograd_, strip(grad_output), retain_graph);
}
DTensor DTensor::detach() const { return strip(*this); }

void DTensor::record_local() const {
  if (!grad_mode || !in_graph(autograd_)) return;
  local_ = record_to_local(*this, local_, placements());
}

Tensor DTensor::to_local(const Layout& grad_layout) const {
  Tensor out = detached(local_);
  if (!grad_mode || !in_graph(autograd_)) return out;
  return record_to_local(*this, out, validate_layout(grad_layout, mesh_.shape(), shape()));
}

}  // namespace dtensor
