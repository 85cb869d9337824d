#pragma once
// Autograd's internals: the per-tensor record, the graph's nodes and the
// recording entry points that call_op and the layout changes use.
#include <cstdint>
#include <functional>
#include <utility>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "dtensor/api/autograd.h"

namespace dtensor {

using AnyTensor = std::variant<Tensor, DTensor>;
class Node;

struct AutogradMeta {
  bool requires_grad = false;     // a leaf marked by requires_grad_()
  std::shared_ptr<Node> grad_fn;  // the node that made the tensor (null: a leaf)
  std::optional<AnyTensor> grad;  // a leaf's accumulated gradient
  // A leaf's on_gradient_ready hooks, run when a backward has added its
  // last contribution to `grad`.
  std::vector<std::pair<std::uint64_t, std::function<void()>>> grad_ready_hooks;  // (id, hook)
  // A leaf's on_next_read hook: run (and forgotten) before the next read.
  std::function<void()> before_read;
  bool in_graph() const { return requires_grad || grad_fn; }
};

inline bool in_graph(const std::shared_ptr<AutogradMeta>& m) { return m && m->in_graph(); }

/// Where an input's gradient goes: the node that made it, or a leaf's
/// record (both null: nowhere).
struct Edge {
  std::shared_ptr<Node> fn;
  std::shared_ptr<AutogradMeta> leaf;
};
Edge edge_of(const std::shared_ptr<AutogradMeta>& meta);

/// Runs and forgets x's on_next_read hook, if it has one: called by what
/// reads a DTensor's values (call_op, redistribute, redistribute_all and
/// its started form) before it reads them.
inline void before_reading(const std::shared_ptr<AutogradMeta>& meta) {
  if (!meta || !meta->before_read) return;
  const std::function<void()> hook = std::exchange(meta->before_read, nullptr);
  hook();
}

/// A node's edges and saved inputs: most ops take one to three tensors, so
/// the first N live inside the node (recording allocates no vector for
/// them); more go to a vector. Append-only, then read as a span.
template <class T, std::size_t N>
class NodeSlots {
 public:
  NodeSlots() = default;
  NodeSlots(const NodeSlots&) = delete;
  NodeSlots& operator=(const NodeSlots&) = delete;
  ~NodeSlots() { clear(); }
  void reserve(std::size_t n) {
    if (n > N && size_ == 0) spill_.reserve(n);
  }
  void push_back(T value) {
    if (spill_.capacity() > 0 || size_ == N) {
      if (spill_.empty() && size_ > 0) move_to_spill();
      spill_.push_back(std::move(value));
    } else {
      ::new (static_cast<void*>(slot(size_))) T(std::move(value));
    }
    ++size_;
  }
  void clear() {
    if (spill_.capacity() == 0)
      for (std::size_t i = 0; i < size_; ++i) std::destroy_at(slot(i));
    spill_.clear();
    size_ = 0;
  }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* data() { return spill_.capacity() > 0 ? spill_.data() : slot(0); }
  const T* data() const { return spill_.capacity() > 0 ? spill_.data() : slot(0); }
  T& operator[](std::size_t i) { return data()[i]; }
  const T& operator[](std::size_t i) const { return data()[i]; }
  T* begin() { return data(); }
  T* end() { return data() + size_; }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size_; }
  operator std::span<const T>() const { return {data(), size_}; }  // NOLINT: read as a span, as a vector is

 private:
  T* slot(std::size_t i) { return std::launder(reinterpret_cast<T*>(inline_)) + i; }
  const T* slot(std::size_t i) const { return std::launder(reinterpret_cast<const T*>(inline_)) + i; }
  void move_to_spill() {
    spill_.reserve(2 * N);
    for (std::size_t i = 0; i < size_; ++i) {
      spill_.push_back(std::move(*slot(i)));
      std::destroy_at(slot(i));
    }
  }
  alignas(T) unsigned char inline_[N * sizeof(T)];
  std::size_t size_ = 0;
  std::vector<T> spill_;  // in use once it has a capacity
};

class Node {
 public:
  Node();  // takes this thread's next sequence number
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  /// What made the node, for messages ("linear", "redistribute").
  virtual std::string name() const = 0;
  /// The gradients of the edges' tensors, one per edge (empty: none).
  virtual std::vector<std::optional<AnyTensor>> apply(const AnyTensor& grad) = 0;
  /// Run when the node is ready but no gradient reached its output: a node
  /// whose gradients come by another route (a group fed by its parts, as in
  /// redistribute_all's record) sends them on here. Default: none.
  virtual std::vector<std::optional<AnyTensor>> apply_collected() { return {}; }
  /// The gradients of the edges `wanted` marks, and no others, for a
  /// backward run in two halves (backward_input: the input gradient now,
  /// the weights' later). Only a node that says it can (splits_edges(): a
  /// recorded op, whose rule computes each input's gradient apart) is asked;
  /// the engine computes every other node's edges at once and keeps those
  /// it does not want yet.
  virtual bool splits_edges() const { return false; }
  virtual std::vector<std::optional<AnyTensor>> apply_edges(const AnyTensor& grad, const std::vector<bool>& wanted) {
    (void)wanted;
    return apply(grad);
  }
  /// Drops what the node saved (after a backward without retain_graph).
  virtual void release() = 0;

  NodeSlots<Edge, 3> edges;
  /// Creation order on this thread: backward runs nodes from the newest, the
  /// same order on every rank, so that their collectives match.
  std::uint64_t sequence;
  bool released = false;
};

/// The record of a call with several outputs. Each output's grad_fn is a
/// part with one edge to the group: it hands the output's gradient over.
/// The group is made before its parts, so it is older and the engine runs it
/// after every part the loss reaches; it then computes its inputs'
/// gradients from all of them at once (redistribute_all's one collective
/// back, split's one cat instead of a zero-padded sum per piece).
class GroupNode : public Node {
 public:
  explicit GroupNode(std::size_t outputs) : arrived_(outputs) {}
  // No output of its own: its gradients come from its parts.
  std::vector<std::optional<AnyTensor>> apply(const AnyTensor&) override { return apply_collected(); }
  std::vector<std::optional<AnyTensor>> apply_collected() override;
  /// The engine sums what reaches a part before running it: one arrival
  /// per output and backward.
  void receive(std::size_t k, AnyTensor grad) { arrived_[k] = std::move(grad); }

 protected:
  /// One gradient per edge from the outputs' gradients (unset: none came).
  virtual std::vector<std::optional<AnyTensor>> backward(std::vector<std::optional<AnyTensor>> arrived) = 0;

 private:
  std::vector<std::optional<AnyTensor>> arrived_;
};

/// The engine's steps, shared by backward and the split backward
/// (autograd_split.cpp): the sum of two gradients of one tensor, a leaf's
/// accumulation, and the order nodes run in (newest first: the same on every
/// rank, so that their collectives match).
AnyTensor add_grads(const AnyTensor& a, const AnyTensor& b);
void accumulate(AutogradMeta& leaf, const AnyTensor& grad);
struct Later {
  bool operator()(const Node* a, const Node* b) const { return a->sequence < b->sequence; }
};
/// The gradient backward() starts a 0-d loss from: one (on every rank,
/// Replicate, for a DTensor). ValueError naming the shape unless 0-d.
void check_scalar(const Shape& shape);
Tensor unit_gradient(const Tensor& loss);
DTensor unit_gradient(const DTensor& loss);
/// ShapeError unless a backward's grad_output has the output's shape.
void check_grad_shape(const Shape& shape, const Shape& grad);
/// The AutogradError for a graph freed by an earlier backward.
[[noreturn]] void throw_freed_graph(const Node& node);
/// How many edges lead into each node below `roots` (the roots themselves
/// count only the edges from other nodes); AutogradError if any node was
/// freed, before anything runs.
std::unordered_map<Node*, int> incoming_edges(std::span<Node* const> roots);

/// Makes `out` output k of `group`.
void attach_part(Tensor& out, const std::shared_ptr<GroupNode>& group, std::size_t k);
void attach_part(DTensor& out, const std::shared_ptr<GroupNode>& group, std::size_t k);

/// The same data with no record (what nodes save, so that a saved output
/// does not hold its own node).
Tensor detached(const Tensor& t);
DTensor detached(const DTensor& t);

/// Makes `out` the output of `node`.
void attach(Tensor& out, std::shared_ptr<Node> node);
void attach(DTensor& out, std::shared_ptr<Node> node);

/// call_op's recording (out's own record is replaced either way).
void record_op(const OpDef& op, const OpAttrs& attrs, std::span<const Tensor> inputs, Tensor& out);
/// Whether call_op records this call (grad mode on, an input in a graph,
/// the op differentiable).
bool records(const OpDef& op, std::span<const DTensor* const> inputs);
/// `as_used[i]`, where set, is input i as the kernel received it (after
/// dispatch moved it): the node saves that instead of the input, so that
/// the backward finds it where the forward had it (Megatron's sequence
/// parallelism keeps its gathered x, not re-gathered for W's gradient).
void record_op(const OpDef& op, const OpAttrs& attrs, std::span<const DTensor* const> inputs, DTensor& out,
               std::span<const std::optional<DTensor>> as_used);

/// The layout changes' recording (autograd_layout.cpp).
void record_redistribute(const DTensor& in, DTensor& out);
void record_from_local(const Tensor& local, DTensor& out);
void record_distribute(bool source_requires_grad, const Tensor& full, DTensor& out);
Tensor record_to_local(const DTensor& in, const Tensor& local, const Layout& grad_layout);

/// The library's own rules (autograd_rules.cpp): name -> rule, and the
/// names of the ops marked not differentiable.
std::vector<std::pair<std::string_view, std::shared_ptr<const BackwardRule>>> builtin_backward_rules();
std::vector<std::string_view> builtin_not_differentiable();

}  // namespace dtensor
