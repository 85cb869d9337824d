// CommTree: counts are taken as differences of the mesh's group stats at
// every scope boundary, so the communicators know nothing of scopes and a
// thread without a tree pays one thread-local read per scope.
#include "dtensor/api/comm_tree.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "comm_stats.h"
#include "dtensor/core/error.h"
#include "dtensor/mesh/detail/trace_recorder.h"

namespace dtensor {
namespace {

thread_local CommTree* active_tree = nullptr;

/// Adds `more` into `into`, keeping the order by dims, then kind.
void add_counts(std::vector<DimsCount>& into, const std::vector<DimsCount>& more) {
  for (const DimsCount& c : more) {
    auto same = std::find_if(into.begin(), into.end(),
                             [&](const DimsCount& o) { return o.mesh_dims == c.mesh_dims && o.kind == c.kind; });
    if (same != into.end()) {
      same->count += c.count;
      same->bytes += c.bytes;
    } else {
      into.push_back(c);
    }
  }
  std::sort(into.begin(), into.end(), [](const DimsCount& a, const DimsCount& b) {
    return a.mesh_dims != b.mesh_dims ? a.mesh_dims < b.mesh_dims : a.kind < b.kind;
  });
}

void text_lines(const CommNode& node, int depth, std::string& out) {
  std::string own = node.counts.empty() ? std::string("-") : fmt::format("{}", fmt::join(node.counts, "; "));
  out += fmt::format("{:{}}{}: {}", "", 2 * depth, node.name, own);
  if (!node.children.empty() && !node.counts.empty()) {
    out += fmt::format("  (with the scopes inside: {})", fmt::join(node.total(), "; "));
  } else if (!node.children.empty()) {
    const auto total = node.total();
    if (!total.empty()) out += fmt::format("  (inside: {})", fmt::join(total, "; "));
  }
  out += '\n';
  for (const CommNode& child : node.children) text_lines(child, depth + 1, out);
}

nlohmann::ordered_json node_json(const CommNode& node) {
  nlohmann::ordered_json j;
  j["name"] = node.name;
  j["counts"] = nlohmann::ordered_json::array();
  for (const DimsCount& c : node.counts)
    j["counts"].push_back({{"mesh_dims", c.mesh_dims},
                           {"dim_names", c.dim_names},
                           {"kind", collective_name(c.kind)},
                           {"count", c.count},
                           {"bytes", c.bytes}});
  j["children"] = nlohmann::ordered_json::array();
  for (const CommNode& child : node.children) j["children"].push_back(node_json(child));
  return j;
}

}  // namespace

std::vector<DimsCount> CommNode::total() const {
  std::vector<DimsCount> out = counts;
  for (const CommNode& child : children) add_counts(out, child.total());
  return out;
}

std::uint64_t CommNode::total_count(CollectiveKind kind) const {
  std::uint64_t n = 0;
  for (const DimsCount& c : total())
    if (c.kind == kind) n += c.count;
  return n;
}

const CommNode* CommNode::child(std::string_view wanted) const {
  for (const CommNode& c : children)
    if (c.name == wanted) return &c;
  return nullptr;
}

CommTree::CommTree(const DeviceMesh& mesh, std::string root_name)
    : mesh_(mesh), last_(mesh.group_stats()), previous_(active_tree) {
  root_.name = std::move(root_name);
  active_tree = this;
}

CommTree::~CommTree() { active_tree = previous_; }

CommNode& CommTree::open_node() {
  CommNode* node = &root_;
  for (std::size_t i : path_) node = &node->children[i];
  return *node;
}

void CommTree::flush() {
  std::vector<GroupStats> now = mesh_.group_stats();
  add_counts(open_node().counts, detail::dims_counts(detail::stats_since(now, last_), mesh_.dim_names()));
  last_ = std::move(now);
}

void CommTree::enter(std::string_view name) {
  flush();
  CommNode& parent = open_node();
  auto it = std::find_if(parent.children.begin(), parent.children.end(),
                         [&](const CommNode& c) { return c.name == name; });
  if (it == parent.children.end()) {
    parent.children.push_back(CommNode{std::string(name), {}, {}});
    it = std::prev(parent.children.end());
  }
  path_.push_back(static_cast<std::size_t>(it - parent.children.begin()));
}

void CommTree::leave() {
  flush();
  path_.pop_back();
}

const CommNode& CommTree::root() {
  flush();
  return root_;
}

std::string CommTree::text() {
  std::string out;
  text_lines(root(), 0, out);
  return out;
}

std::string CommTree::json() { return node_json(root()).dump(); }

CommScope::CommScope(std::string_view name) : traced_(trace::ScopeSpan::open(name)) {
  CommTree* tree = active_tree;
  if (tree == nullptr) return;
  if (!tree->path_.empty() && tree->open_node().name == name) return;  // already open: no nesting
  tree->enter(name);
  tree_ = tree;
}

CommScope::~CommScope() {
  // The tree may have been destroyed first only if the caller nested them
  // the wrong way round; a tree outlives the scopes opened under it.
  if (tree_ != nullptr && active_tree == tree_) tree_->leave();
}

}  // namespace dtensor
