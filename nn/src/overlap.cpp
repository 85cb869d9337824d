#include "dtensor/nn/overlap.h"

#include <fmt/format.h>

#include "dtensor/core/error.h"

namespace dtensor::nn {

OverlappedGradientReduction::OverlappedGradientReduction(std::span<DTensor> params, std::vector<Layout> reduce_to,
                                                         CoalesceOptions buckets)
    : coalesce_(buckets) {
  check_coalesce_options(coalesce_, "OverlappedGradientReduction");
  if (!reduce_to.empty() && reduce_to.size() != params.size())
    throw ValueError(fmt::format("[OverlappedGradientReduction] {} layouts to reduce to for {} parameters: expected "
                                 "one each (or none)",
                                 reduce_to.size(), params.size()));
  for (std::size_t k = 0; k < params.size(); ++k) {
    DTensor& p = params[k];
    if (!p.requires_grad()) continue;
    const std::size_t i = params_.size();
    params_.push_back(&p);
    targets_.push_back(reduce_to.empty() ? p.placements() : reduce_to[k]);
    hooks_.push_back(on_gradient_ready(p, [this, i] { ready(i); }));
  }
  bucket_of_.assign(params_.size(), std::nullopt);
}

void OverlappedGradientReduction::ready(std::size_t param) {
  if (!enabled_ || buckets_.empty()) return;
  const auto bucket = bucket_of_[param];
  if (!bucket) return;
  if (pending_.empty()) {  // the first gradient of this step
    pending_.resize(buckets_.size());
    for (std::size_t b = 0; b < buckets_.size(); ++b) pending_[b] = buckets_[b].size();
    started_.clear();
    started_.resize(buckets_.size());
  }
  if (pending_[*bucket] > 0 && --pending_[*bucket] == 0) start(*bucket);
}

void OverlappedGradientReduction::start(std::size_t bucket) {
  std::vector<DTensor> grads;
  std::vector<Layout> to;
  for (std::size_t i : buckets_[bucket]) {
    const std::optional<DTensor> g = params_[i]->grad();
    // A layout other than the learnt one would make another call: this
    // bucket then waits for finish(), which reduces it as the blocking
    // path does.
    if (!g || g->placements() != grad_layouts_[i]) return;
    grads.push_back(*g);
    to.push_back(targets_[i]);
  }
  started_[bucket] = start_redistribute_all(grads, to, one_call());
  ++started_last_step_;
}

void OverlappedGradientReduction::finish() {
  // The started buckets, in the order they were learnt (the same on every
  // rank, as every wait must be).
  for (std::size_t b = 0; b < started_.size(); ++b) {
    if (!started_[b]) continue;
    std::vector<DTensor> reduced = started_[b]->wait();
    started_[b].reset();
    for (std::size_t k = 0; k < buckets_[b].size(); ++k) params_[buckets_[b][k]]->set_grad(reduced[k]);
  }
  // Whatever is still Partial (all of it in the first step), as the blocking
  // path reduces it; the first step learns its calls.
  std::vector<std::size_t> which;
  std::vector<DTensor> partial;
  std::vector<Layout> to;
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (const std::optional<DTensor> g = params_[i]->grad(); g && g->placements().has_partial()) {
      which.push_back(i);
      partial.push_back(*g);
      to.push_back(targets_[i]);
    }
  if (buckets_.empty() && !partial.empty()) {
    grad_layouts_.assign(params_.size(), Layout{});
    for (std::size_t k = 0; k < which.size(); ++k) grad_layouts_[which[k]] = partial[k].placements();
    for (std::vector<std::size_t>& call : coalesced_calls(partial, to, coalesce_)) {
      for (std::size_t& k : call) {
        k = which[k];
        bucket_of_[k] = buckets_.size();
      }
      buckets_.push_back(std::move(call));
    }
  }
  if (!partial.empty()) {
    std::vector<DTensor> reduced = redistribute_all(partial, to, coalesce_);
    for (std::size_t k = 0; k < which.size(); ++k) params_[which[k]]->set_grad(reduced[k]);
  }
  pending_.clear();
  started_.clear();
  started_last_step_ = 0;
}

}  // namespace dtensor::nn
