#pragma once
// The collectives of a region of a program, split by named scopes: PyTorch's
// CommDebugMode module tree, but with the backward pass and the optimizer
// step as scopes of their own (they open "backward" and "optimizer" by
// themselves while a tree records).
//
//   CommTree tree(mesh);
//   { CommScope forward("forward"); loss = model.loss(x, y); }
//   loss.backward();          // counted under "backward"
//   optimizer.step();         // counted under "optimizer"
//   fmt::print("{}", tree.text());
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/api/functional.h"
#include "dtensor/mesh/device_mesh.h"

namespace dtensor {

namespace trace {
class ScopeSpan;
}

/// One scope of a CommTree: the collectives issued while it was the
/// innermost open scope (its own), and the scopes opened inside it, in the
/// order they were first opened. A scope opened again under the same parent
/// (the next micro-batch's "forward") adds to the same node.
struct CommNode {
  std::string name;
  std::vector<DimsCount> counts;  // own, ordered by dims, then kind
  std::vector<CommNode> children;

  /// Own counts plus every descendant's.
  std::vector<DimsCount> total() const;
  /// Calls of `kind` in this node and its descendants.
  std::uint64_t total_count(CollectiveKind kind) const;
  /// The child named `name`, or null.
  const CommNode* child(std::string_view name) const;
};

/// While alive, this thread's collectives on `mesh` (and its submeshes'
/// communicators) are counted into a tree of the CommScopes opened on this
/// thread. Trees nest: an inner tree records until it is destroyed, then
/// the outer one resumes (and counts what the inner one saw as its own).
class CommTree {
 public:
  explicit CommTree(const DeviceMesh& mesh, std::string root_name = "total");
  ~CommTree();
  CommTree(const CommTree&) = delete;
  CommTree& operator=(const CommTree&) = delete;

  /// The tree so far (collectives since the last scope change included).
  const CommNode& root();
  /// One line per scope, indented by depth: its own collectives, and the
  /// total of a scope with children, e.g.
  ///   total: [tp] all_reduce x4 (64 KiB)
  ///     forward: [tp] all_reduce x2 (32 KiB)
  std::string text();
  /// The tree as JSON: {"name", "counts": [{"mesh_dims", "dim_names", "kind",
  /// "count", "bytes"}], "children": [...]}.
  std::string json();

 private:
  friend class CommScope;
  void enter(std::string_view name);
  void leave();
  void flush();
  CommNode& open_node();

  DeviceMesh mesh_;
  std::vector<GroupStats> last_;
  CommNode root_;
  std::vector<std::size_t> path_;  // child indices from the root to the open scope
  CommTree* previous_;
};

/// Names a region for the CommTree recording on this thread and, while a
/// TraceScope records, for its trace (an event on the rank's "scopes"
/// track); nothing when neither records: two thread-local reads. A scope
/// named as the one already open does not nest (a "backward" inside the
/// user's own "backward").
class CommScope {
 public:
  explicit CommScope(std::string_view name);
  ~CommScope();
  CommScope(const CommScope&) = delete;
  CommScope& operator=(const CommScope&) = delete;

 private:
  CommTree* tree_ = nullptr;
  std::unique_ptr<trace::ScopeSpan> traced_;
};

}  // namespace dtensor
