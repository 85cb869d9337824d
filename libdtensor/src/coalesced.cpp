// redistribute_all: plans every move first (so a bad target fails on every
// rank before any collective runs), then runs the moves that go alone, then
// one packed collective per bucket.
#include "dtensor/api/coalesced.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtensor/api/autograd.h"
#include "dtensor/core/error.h"
#include "dtensor/redistribute/coalesced.h"
#include "autograd_engine.h"

namespace dtensor {
namespace {

constexpr double kBytesPerMiB = 1024.0 * 1024.0;

void check_arguments(std::span<const DTensor> tensors, std::span<const Layout> targets, const CoalesceOptions& o) {
  if (tensors.size() != targets.size())
    throw ValueError(fmt::format("[redistribute_all] {} tensors and {} target layouts: expected one layout per tensor",
                                 tensors.size(), targets.size()));
  check_coalesce_options(o, "redistribute_all");
  for (std::size_t i = 1; i < tensors.size(); ++i)
    if (!(tensors[i].mesh() == tensors[0].mesh()))
      throw MeshError(fmt::format("[redistribute_all] tensor {} lives on mesh {}, tensor 0 on mesh {}: one call "
                                  "runs on one mesh",
                                  i, tensors[i].mesh(), tensors[0].mesh()));
}

// A move's share of a bucket, the same on every rank (see CoalesceOptions).
double bucket_bytes(const Plan& plan) {
  const Shape origin(plan.mesh_shape.size(), 0);
  const std::int64_t in = local_box(plan.mesh_shape, plan.global_shape, plan.from, origin).numel();
  const std::int64_t out = local_box(plan.mesh_shape, plan.global_shape, plan.to, origin).numel();
  return static_cast<double>(std::max(in, out)) * static_cast<double>(itemsize(plan.dtype));
}

// The coordinate of mesh rank r (row-major, the last dim fastest).
Shape unravel(std::int64_t r, const Shape& mesh_shape) {
  Shape c(mesh_shape.size());
  for (int m = static_cast<int>(mesh_shape.size()) - 1; m >= 0; --m) {
    c[m] = r % mesh_shape[m];
    r /= mesh_shape[m];
  }
  return c;
}

// The one all_gather that makes the same move as `plan`, where the planner
// chose a direct exchange (alone it is cheaper where few ranks hold data, as
// for a tensor of fewer rows than ranks: it skips the ring's hops). The move
// must be Shard(d) -> Replicate on some mesh dims, nothing else changing,
// and every rank's new box must be exactly its group's old boxes (checked
// on every rank's boxes, so every rank answers alike). Same bytes per rank
// as the exchange: each rank receives the part of its new box it lacks.
std::optional<Plan> as_all_gather(const Plan& plan) {
  if (plan.steps.size() != 1 || plan.steps[0].kind != StepKind::Exchange) return std::nullopt;
  std::vector<int> dims;
  std::int64_t dim = -1;
  for (int m = 0; m < plan.from.mesh_ndim(); ++m) {
    if (plan.from[m] == plan.to[m]) continue;
    if (!is_shard(plan.from[m]) || !is_replicate(plan.to[m])) return std::nullopt;
    if (dim >= 0 && !is_shard(plan.from[m], dim)) return std::nullopt;
    dim = std::get<Shard>(plan.from[m]).dim;
    dims.push_back(m);
  }
  if (dims.empty()) return std::nullopt;
  std::int64_t group = 1;
  for (int m : dims) group *= plan.mesh_shape[m];
  const auto isz = static_cast<std::int64_t>(itemsize(plan.dtype));
  std::vector<std::int64_t> recv(static_cast<std::size_t>(numel(plan.mesh_shape)), 0);
  for (std::int64_t r = 0; r < numel(plan.mesh_shape); ++r) {
    const Shape coord = unravel(r, plan.mesh_shape);
    const Box whole = local_box(plan.mesh_shape, plan.global_shape, plan.to, coord);
    std::int64_t covered = 0;
    for (std::int64_t i = 0; i < group; ++i) {
      Shape c = coord;
      for (std::int64_t j = static_cast<std::int64_t>(dims.size()) - 1, k = i; j >= 0; --j) {
        c[dims[j]] = k % plan.mesh_shape[dims[j]];
        k /= plan.mesh_shape[dims[j]];
      }
      const Box piece = local_box(plan.mesh_shape, plan.global_shape, plan.from, c);
      if (!contains(whole, piece)) return std::nullopt;
      covered += piece.numel();
      if (c != coord) recv[r] += piece.numel() * isz;
    }
    if (covered != whole.numel()) return std::nullopt;
  }
  Plan gather = plan;
  PlanStep& step = gather.steps[0];
  step = PlanStep{StepKind::AllGather, dims, dim, -1, plan.from, plan.to, recv, step.est_seconds,
                  "the exchange the planner chose, as the all_gather a coalesced call already runs", {}};
  gather.recv_bytes = recv;
  return gather;
}

struct Bucket {
  CollectiveSignature signature;
  std::vector<std::size_t> moves;
  double bytes = 0;
  double cap = 0;  // the most bytes it takes
  bool open = true;
};

// Greedy in the options' order: a move joins the open bucket of its
// collective while that stays within the bucket's cap (the first bucket of
// a collective may have its own); otherwise that bucket closes and the move
// opens a new one (alone, and closed at once, if it exceeds the cap itself).
std::vector<Bucket> make_buckets(const std::vector<std::optional<CollectiveSignature>>& signatures,
                                 const std::vector<Plan>& plans, const CoalesceOptions& options) {
  const double cap = options.bucket_mib * kBytesPerMiB;
  const double first_cap = options.first_bucket_mib.value_or(options.bucket_mib) * kBytesPerMiB;
  std::vector<Bucket> buckets;
  for (std::size_t k = 0; k < plans.size(); ++k) {
    const std::size_t i = options.order == BucketOrder::LastFirst ? plans.size() - 1 - k : k;
    if (!signatures[i]) continue;
    const double bytes = bucket_bytes(plans[i]);
    Bucket* open = nullptr;
    bool first = true;  // no bucket of this collective yet
    for (Bucket& b : buckets)
      if (b.signature == *signatures[i]) {
        first = false;
        if (b.open) open = &b;
      }
    if (open && open->bytes + bytes > open->cap) {
      open->open = false;
      open = nullptr;
    }
    if (!open) open = &buckets.emplace_back(Bucket{*signatures[i], {}, 0, first ? first_cap : cap, true});
    open->moves.push_back(i);
    open->bytes += bytes;
    if (open->bytes > open->cap) open->open = false;
  }
  return buckets;
}

// The output of a packed move: what redistribute() would have built.
DTensor wrap(const DTensor& input, const Plan& plan, Tensor local) {
  return DTensor::from_local(std::move(local), input.mesh(), plan.to, input.shape(), FromLocalCheck::Trust)
      .with_cost_model(input.cost_model());
}

void run_bucket(const Bucket& bucket, std::span<const DTensor> tensors, std::span<const Layout> targets,
                const std::vector<Plan>& plans, std::vector<DTensor>& out) {
  if (bucket.moves.size() == 1) {
    const std::size_t i = bucket.moves.front();
    out[i] = tensors[i].redistribute(targets[i]);
    return;
  }
  std::vector<const Plan*> members;
  std::vector<Tensor> locals;
  for (std::size_t i : bucket.moves) {
    members.push_back(&plans[i]);
    locals.push_back(tensors[i].to_local());
  }
  std::vector<Tensor> results = execute_coalesced(members, tensors[bucket.moves.front()].mesh(), locals);
  for (std::size_t k = 0; k < bucket.moves.size(); ++k) {
    const std::size_t i = bucket.moves[k];
    out[i] = wrap(tensors[i], plans[i], std::move(results[k]));
  }
}

// The record of a redistribute_all: the gradients that reach its outputs go
// back to the inputs' layouts in one redistribute_all.
class RedistributeAllNode final : public GroupNode {
 public:
  explicit RedistributeAllNode(std::vector<Layout> back) : GroupNode(back.size()), back_(std::move(back)) {}
  std::string name() const override { return "redistribute_all"; }
  void release() override { released = true; }

 protected:
  std::vector<std::optional<AnyTensor>> backward(std::vector<std::optional<AnyTensor>> arrived) override {
    std::vector<DTensor> moving;
    std::vector<Layout> to;
    std::vector<std::size_t> which;
    for (std::size_t k = 0; k < arrived.size(); ++k)
      if (arrived[k]) {
        moving.push_back(std::get<DTensor>(std::move(*arrived[k])));
        to.push_back(back_[k]);
        which.push_back(k);
      }
    std::vector<DTensor> back = redistribute_all(moving, to);
    std::vector<std::optional<AnyTensor>> grads(back_.size());
    for (std::size_t j = 0; j < which.size(); ++j) grads[which[j]] = AnyTensor(std::move(back[j]));
    return grads;
  }

 private:
  std::vector<Layout> back_;  // per edge: the input's layout, Partial replaced by Replicate
};

// A call's moves, planned and sorted: the ones that run alone, and the
// buckets of the ones that share a collective.
struct Moves {
  std::vector<DTensor> out;  // the inputs, replaced by each move's result
  std::vector<Plan> plans;
  std::vector<std::size_t> alone;
  std::vector<Bucket> buckets;
};

Moves plan_moves(std::span<const DTensor> tensors, std::span<const Layout> targets, const CoalesceOptions& options) {
  Moves m;
  m.out.assign(tensors.begin(), tensors.end());
  m.plans.resize(tensors.size());
  std::vector<std::optional<CollectiveSignature>> signatures(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (targets[i] == tensors[i].placements()) continue;  // as redistribute(): the same DTensor
    m.plans[i] = tensors[i].plan_to(targets[i]);         // a copy: later lookups may evict the cached one
    signatures[i] = coalescible_signature(m.plans[i]);
  }
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (targets[i] == tensors[i].placements()) continue;
    // An exchange joins the all_gather of the same move when other moves run
    // that all_gather anyway: riding along adds its bytes but no call.
    if (!signatures[i])
      if (std::optional<Plan> gather = as_all_gather(m.plans[i]))
        if (std::find(signatures.begin(), signatures.end(), coalescible_signature(*gather)) != signatures.end()) {
          signatures[i] = coalescible_signature(*gather);
          m.plans[i] = std::move(*gather);
        }
    if (!signatures[i]) m.alone.push_back(i);
  }
  m.buckets = make_buckets(signatures, m.plans, options);
  return m;
}

std::vector<DTensor> run_moves(std::span<const DTensor> tensors, std::span<const Layout> targets,
                               const CoalesceOptions& options) {
  Moves m = plan_moves(tensors, targets, options);
  for (std::size_t i : m.alone) m.out[i] = tensors[i].redistribute(targets[i]);
  for (const Bucket& bucket : m.buckets) run_bucket(bucket, tensors, targets, m.plans, m.out);
  return std::move(m.out);
}

// Runs the moves unrecorded on detached inputs, then records one group for
// the outputs whose inputs are in a graph.
std::vector<DTensor> run_recorded(std::span<const DTensor> tensors, std::span<const Layout> targets,
                                  const std::vector<std::size_t>& recorded, const CoalesceOptions& options) {
  std::vector<DTensor> plain;
  for (const DTensor& t : tensors) plain.push_back(detached(t));
  std::vector<DTensor> out = [&] {
    NoGradGuard unrecorded;
    return run_moves(plain, targets, options);
  }();
  std::vector<Layout> back;
  for (std::size_t i : recorded) back.push_back(tensors[i].placements().without_partial());
  auto group = std::make_shared<RedistributeAllNode>(std::move(back));  // older than its parts: runs after them
  for (std::size_t i : recorded) group->edges.push_back(edge_of(tensors[i].autograd_meta()));
  for (std::size_t k = 0; k < recorded.size(); ++k) attach_part(out[recorded[k]], group, k);
  return out;
}

}  // namespace

void check_coalesce_options(const CoalesceOptions& o, std::string_view caller) {
  auto check = [&](std::string_view name, double mib) {
    if (!std::isfinite(mib) || !(mib > 0))
      throw ValueError(fmt::format("[{}] {} = {}; expected a finite number > 0", caller, name, mib));
  };
  check("bucket_mib", o.bucket_mib);
  if (o.first_bucket_mib) check("first_bucket_mib", *o.first_bucket_mib);
}

std::vector<DTensor> redistribute_all(std::span<const DTensor> tensors, std::span<const Layout> targets,
                                      CoalesceOptions options) {
  check_arguments(tensors, targets, options);
  for (const DTensor& t : tensors) before_reading(t.autograd_meta());
  std::vector<std::size_t> recorded;
  if (grad_enabled())
    for (std::size_t i = 0; i < tensors.size(); ++i)
      if (targets[i] != tensors[i].placements() && in_graph(tensors[i].autograd_meta())) recorded.push_back(i);
  if (!recorded.empty()) return run_recorded(tensors, targets, recorded, options);
  return run_moves(tensors, targets, options);
}

std::vector<std::vector<std::size_t>> coalesced_calls(std::span<const DTensor> tensors, std::span<const Layout> targets,
                                                      CoalesceOptions options) {
  check_arguments(tensors, targets, options);
  const Moves m = plan_moves(tensors, targets, options);
  std::vector<std::vector<std::size_t>> calls;
  for (std::size_t i : m.alone) calls.push_back({i});
  for (const Bucket& bucket : m.buckets) calls.push_back(bucket.moves);
  return calls;
}

struct StartedRedistribution::State {
  std::vector<DTensor> inputs;
  Moves moves;
  std::vector<StartedCoalesced> calls;  // one per bucket, in bucket order
};

StartedRedistribution::StartedRedistribution(std::unique_ptr<State> state) : state_(std::move(state)) {}
StartedRedistribution::StartedRedistribution(StartedRedistribution&&) noexcept = default;
StartedRedistribution& StartedRedistribution::operator=(StartedRedistribution&&) noexcept = default;
StartedRedistribution::~StartedRedistribution() = default;

StartedRedistribution start_redistribute_all(std::span<const DTensor> tensors, std::span<const Layout> targets,
                                             CoalesceOptions options) {
  check_arguments(tensors, targets, options);
  for (const DTensor& t : tensors) before_reading(t.autograd_meta());
  auto st = std::make_unique<StartedRedistribution::State>();
  NoGradGuard unrecorded;
  for (const DTensor& t : tensors) st->inputs.push_back(detached(t));
  st->moves = plan_moves(st->inputs, targets, options);
  Moves& m = st->moves;
  for (std::size_t i : m.alone) m.out[i] = st->inputs[i].redistribute(targets[i]);
  for (const Bucket& bucket : m.buckets) {
    std::vector<const Plan*> members;
    std::vector<Tensor> locals;
    for (std::size_t i : bucket.moves) {
      members.push_back(&m.plans[i]);
      locals.push_back(st->inputs[i].to_local());
    }
    st->calls.push_back(start_coalesced(members, st->inputs[bucket.moves.front()].mesh(), locals));
  }
  return StartedRedistribution(std::move(st));
}

std::vector<DTensor> StartedRedistribution::wait() {
  if (!state_) throw ValueError("[StartedRedistribution::wait] already waited for: each one is waited for once");
  const std::unique_ptr<State> st = std::move(state_);
  Moves& m = st->moves;
  for (std::size_t b = 0; b < m.buckets.size(); ++b) {
    std::vector<Tensor> results = st->calls[b].finish();
    const std::vector<std::size_t>& moves = m.buckets[b].moves;
    for (std::size_t k = 0; k < moves.size(); ++k)
      m.out[moves[k]] = wrap(st->inputs[moves[k]], m.plans[moves[k]], std::move(results[k]));
  }
  return std::move(m.out);
}

}  // namespace dtensor
