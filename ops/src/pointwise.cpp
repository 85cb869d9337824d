// The pointwise family: unary, scalar, binary (numpy broadcasting),
// comparison and where ops. One strategy rule serves them all
// (pointwise_strategy): per mesh dim, everything Replicate; or one output dim
// sharded with every input that holds that dim (trailing-aligned, not
// broadcast from size 1) sharded on its own matching dim and the rest
// Replicate; plus the Partial patterns that the op's algebra allows
// (PartialRule), derived from a few declared properties.
#include <algorithm>
#include <cmath>

#include "cpu/pointwise_kernels.h"
#include "device_kernels.h"
#include "dtensor/core/error.h"
#include "families.h"

namespace dtensor {
namespace {

using pointwise::Binary;
using pointwise::Unary;

// A Partial candidate: the inputs marked hold Partial(in), the others
// Replicate; the output is Partial(out).
struct PartialRule {
  std::vector<bool> partial;
  ReduceOp in;
  ReduceOp out;
};

// Per mesh dim (the registry expands them, keeping inputs where they lie
// first: OpDef::prefer_kept_layouts).
std::vector<DimStrategy> pointwise_strategy(const StrategyQuery& q, const std::vector<PartialRule>& rules) {
  const Shape& out = q.output.shape;
  const int nd = static_cast<int>(out.size());
  const std::size_t nin = q.inputs.size();
  std::vector<DimStrategy> per_dim;
  per_dim.push_back({std::vector<Placement>(nin, Replicate{}), Replicate{}});
  for (int d = 0; d < nd; ++d) {
    DimStrategy s{{}, Shard{d}};
    bool any = false;
    for (std::size_t i = 0; i < nin; ++i) {
      const Shape& in = q.inputs[i].shape;
      const int id = d - (nd - static_cast<int>(in.size()));
      if (id >= 0 && in[id] == out[d]) {
        s.inputs.push_back(Shard{id});
        any = true;
      } else {
        s.inputs.push_back(Replicate{});  // absent or broadcast from size 1
      }
    }
    if (any) per_dim.push_back(std::move(s));
  }
  // A Partial rule is offered only when some input arrives with that kind of
  // Partial: making one from Replicate or Shard never beats the Replicate
  // option of the same mesh dim, and every extra option multiplies the
  // candidates the planner must price.
  auto arrives = [&](ReduceOp op) {
    for (const Layout& l : q.layouts)
      for (const Placement& p : l.placements())
        if (const auto* partial = std::get_if<Partial>(&p); partial && partial->op == op) return true;
    return false;
  };
  for (const PartialRule& r : rules) {
    if (!arrives(r.in)) continue;
    DimStrategy s{{}, Partial{r.out}};
    for (std::size_t i = 0; i < nin; ++i) s.inputs.push_back(r.partial[i] ? Placement{Partial{r.in}} : Replicate{});
    per_dim.push_back(std::move(s));
  }
  return per_dim;
}

// ---- Properties that generate Partial rules --------------------------------

// How a unary op commutes with the reductions of Partial placements.
enum class Order { None, Increasing, Decreasing, BySign };  // BySign: of the ScalarAttrs value
struct UnaryAlgebra {
  bool linear = false;        // f(sum) = sum f, f(avg) = avg f: P(sum)/P(avg) pass through
  bool affine = false;        // f(avg) = avg f only: P(avg) passes through
  Order order = Order::None;  // monotone: P(max)/P(min) pass through (swapped if decreasing)
  // Monotone only on a domain bounded below (log, sqrt, rsqrt): the other
  // ranks' terms of a P(max) may lie below it (log of them is NaN), those of
  // a P(min) lie above the value, so only P(min) passes through.
  bool domain_bounded_below = false;
};

std::vector<PartialRule> unary_rules(const UnaryAlgebra& alg, double scalar) {
  std::vector<PartialRule> r;
  if (alg.linear) r.push_back({{true}, ReduceOp::Sum, ReduceOp::Sum});
  if (alg.linear || alg.affine) r.push_back({{true}, ReduceOp::Avg, ReduceOp::Avg});
  Order o = alg.order;
  if (o == Order::BySign) o = scalar >= 0 ? Order::Increasing : Order::Decreasing;
  const bool max_passes = !alg.domain_bounded_below;
  if (o == Order::Increasing) {
    if (max_passes) r.push_back({{true}, ReduceOp::Max, ReduceOp::Max});
    r.push_back({{true}, ReduceOp::Min, ReduceOp::Min});
  } else if (o == Order::Decreasing) {
    if (max_passes) r.push_back({{true}, ReduceOp::Max, ReduceOp::Min});
    r.push_back({{true}, ReduceOp::Min, ReduceOp::Max});
  }
  return r;
}

// sum/avg: both Partial (add, sub), or one Partial and the others Replicate
// (mul by a replicated factor, div of a Partial numerator).
std::vector<PartialRule> linear_rules(std::vector<std::vector<bool>> patterns) {
  std::vector<PartialRule> r;
  for (auto& p : patterns)
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) r.push_back({p, op, op});
  return r;
}

// maximum/minimum: max(max_i a_i, max_i b_i) = max_i max(a_i, b_i), and a
// replicated operand may join any rank's term.
std::vector<PartialRule> extremum_rules(ReduceOp op) {
  return {{{true, true}, op, op}, {{true, false}, op, op}, {{false, true}, op, op}};
}

// ---- Meta -----------------------------------------------------------------

Shape broadcast(const std::string& op, std::span<const TensorMeta> in) {
  std::size_t nd = 0;
  for (const auto& m : in) nd = std::max(nd, m.shape.size());
  Shape out(nd, 1);
  for (const auto& m : in) {
    const std::size_t off = nd - m.shape.size();
    for (std::size_t d = 0; d < m.shape.size(); ++d) {
      const std::int64_t s = m.shape[d];
      std::int64_t& o = out[off + d];
      if (s == o || s == 1) continue;
      if (o == 1) {
        o = s;
        continue;
      }
      std::vector<std::string> shapes;
      for (const auto& x : in)
        shapes.push_back(fmt::format("({}{})", fmt::join(x.shape, ","), x.shape.size() == 1 ? "," : ""));
      throw ShapeError(
          fmt::format("[{}] shapes {} do not broadcast: trailing-aligned dim {} is {} in one and {} in "
                      "another; expected equal sizes or 1",
                      op, fmt::join(shapes, " and "), off + d, o, s));
    }
  }
  return out;
}

void check_same_dtype(const std::string& op, std::span<const TensorMeta> in) {
  for (const auto& m : in)
    if (m.dtype != in[0].dtype) {
      std::vector<std::string> names;
      for (const auto& x : in) names.push_back(std::string(dtype_name(x.dtype)));
      throw DTypeError(fmt::format("[{}] inputs have dtypes {}; expected one dtype (no type promotion)", op,
                                   fmt::join(names, ", ")));
    }
}

// The one check of the floating-only functions: the kernels of every device
// rely on it.
void check_float(const std::string& op, DType dtype) {
  if (!is_floating(dtype))
    throw DTypeError(fmt::format("[{}] is not defined for {} tensors; expected f32, f64, bf16 or f16", op, dtype));
}

// ---- Registration ---------------------------------------------------------

struct UnarySpec {
  const char* name = nullptr;
  Unary fn = Unary::Neg;
  bool float_only = false;
  bool scalar = false;  // takes ScalarAttrs
  UnaryAlgebra algebra{};
  const char* doc = "";
};

struct BinarySpec {
  const char* name = nullptr;
  Binary fn = Binary::Add;
  bool float_only = false;
  std::vector<PartialRule> rules{};
  const char* doc = "";
};

double scalar_of(const std::string& op, bool scalar, const OpAttrs& attrs) {
  return scalar ? attrs.get<ScalarAttrs>(op).value : 0.0;
}

void add_unary(OpRegistry& reg, const UnarySpec& spec) {
  OpDef def;
  def.name = spec.name;
  def.num_inputs = 1;
  def.doc = spec.doc;
  const std::string name = spec.name;
  const bool float_only = spec.float_only;
  const bool scalar = spec.scalar;
  def.meta = [name, float_only, scalar](std::span<const TensorMeta> in, const OpAttrs& attrs) {
    check_same_dtype(name, in);
    if (float_only) check_float(name, in[0].dtype);
    const double value = scalar_of(name, scalar, attrs);
    if (scalar && !is_floating(in[0].dtype) && value != std::trunc(value))
      throw ValueError(
          fmt::format("[{}] scalar {} on an i64 tensor: expected an integer (no type promotion)", name, value));
    return in[0];
  };
  const UnaryAlgebra alg = spec.algebra;
  def.dim_strategy = [alg, name, scalar](const StrategyQuery& q) {
    return pointwise_strategy(q, unary_rules(alg, scalar_of(name, scalar, q.attrs)));
  };
  def.prefer_kept_layouts = true;
  def.cpu_handles_half = true;  // pointwise::unary converts in blocks
  const Unary fn = spec.fn;
  device::bind_kernels(def, [fn, name, scalar](const device::Kernels& k) {
    return [&k, fn, name, scalar](const KernelArgs& a) {
      return k.unary(fn, a.inputs[0], scalar_of(name, scalar, a.attrs));
    };
  });
  reg.add(std::move(def));
}

void add_binary(OpRegistry& reg, BinarySpec spec) {
  OpDef def;
  def.name = spec.name;
  def.num_inputs = 2;
  def.doc = spec.doc;
  const std::string name = spec.name;
  const bool float_only = spec.float_only;
  def.meta = [name, float_only](std::span<const TensorMeta> in, const OpAttrs&) {
    check_same_dtype(name, in);
    if (float_only) check_float(name, in[0].dtype);
    return TensorMeta{broadcast(name, in), in[0].dtype};
  };
  def.dim_strategy = [rules = std::move(spec.rules)](const StrategyQuery& q) { return pointwise_strategy(q, rules); };
  def.prefer_kept_layouts = true;
  def.cpu_handles_half = true;  // pointwise::binary converts in blocks
  const Binary fn = spec.fn;
  device::bind_kernels(def, [fn](const device::Kernels& k) {
    return [&k, fn](const KernelArgs& a) { return k.binary(fn, a.inputs[0], a.inputs[1], a.output_box.size); };
  });
  reg.add(std::move(def));
}

}  // namespace

void register_pointwise_ops(OpRegistry& reg) {
  constexpr Order Inc = Order::Increasing;
  constexpr Order Dec = Order::Decreasing;
  auto monotone = [](Order o) { return UnaryAlgebra{.order = o}; };
  // Monotone on a domain bounded below: only P(min) passes (UnaryAlgebra).
  auto bounded = [](Order o) { return UnaryAlgebra{.order = o, .domain_bounded_below = true}; };
  const UnarySpec unary[] = {
      {.name = "neg", .fn = Unary::Neg, .algebra = {.linear = true, .order = Dec}, .doc = "-x, elementwise"},
      {.name = "abs", .fn = Unary::Abs, .doc = "|x|, elementwise"},
      {.name = "exp", .fn = Unary::Exp, .float_only = true, .algebra = monotone(Inc), .doc = "e^x, elementwise"},
      {.name = "log", .fn = Unary::Log, .float_only = true, .algebra = bounded(Inc), .doc = "natural log, elementwise"},
      {.name = "sqrt",
       .fn = Unary::Sqrt,
       .float_only = true,
       .algebra = bounded(Inc),
       .doc = "square root, elementwise"},
      {.name = "rsqrt",
       .fn = Unary::Rsqrt,
       .float_only = true,
       .algebra = bounded(Dec),
       .doc = "1/sqrt(x), elementwise"},
      {.name = "tanh", .fn = Unary::Tanh, .float_only = true, .algebra = monotone(Inc), .doc = "tanh, elementwise"},
      {.name = "sigmoid",
       .fn = Unary::Sigmoid,
       .float_only = true,
       .algebra = monotone(Inc),
       .doc = "1/(1+e^-x), elementwise"},
      {.name = "relu", .fn = Unary::Relu, .algebra = monotone(Inc), .doc = "max(x, 0), elementwise"},
      {.name = "gelu",
       .fn = Unary::Gelu,
       .float_only = true,
       .doc = "x*Phi(x), exact erf form (PyTorch approximate='none')"},
      {.name = "silu", .fn = Unary::Silu, .float_only = true, .doc = "x*sigmoid(x), elementwise"},
      {.name = "add_scalar",
       .fn = Unary::AddScalar,
       .scalar = true,
       .algebra = {.affine = true, .order = Inc},
       .doc = "x + ScalarAttrs::value"},
      {.name = "mul_scalar",
       .fn = Unary::MulScalar,
       .scalar = true,
       .algebra = {.linear = true, .order = Order::BySign},
       .doc = "x * ScalarAttrs::value"},
      {.name = "div_scalar",
       .fn = Unary::DivScalar,
       .float_only = true,
       .scalar = true,
       .algebra = {.linear = true, .order = Order::BySign},
       .doc = "x / ScalarAttrs::value"},
      {.name = "pow_scalar",
       .fn = Unary::PowScalar,
       .float_only = true,
       .scalar = true,
       .doc = "x ^ ScalarAttrs::value"},
  };
  for (const auto& spec : unary) add_unary(reg, spec);

  add_binary(reg,
             {.name = "add", .fn = Binary::Add, .rules = linear_rules({{true, true}}), .doc = "a + b, broadcasting"});
  add_binary(reg,
             {.name = "sub", .fn = Binary::Sub, .rules = linear_rules({{true, true}}), .doc = "a - b, broadcasting"});
  add_binary(reg, {.name = "mul",
                   .fn = Binary::Mul,
                   .rules = linear_rules({{true, false}, {false, true}}),
                   .doc = "a * b, broadcasting"});
  add_binary(reg, {.name = "div",
                   .fn = Binary::Div,
                   .float_only = true,
                   .rules = linear_rules({{true, false}}),
                   .doc = "a / b, broadcasting"});
  add_binary(reg, {.name = "pow", .fn = Binary::Pow, .float_only = true, .doc = "a ^ b, broadcasting"});
  add_binary(reg, {.name = "maximum",
                   .fn = Binary::Maximum,
                   .rules = extremum_rules(ReduceOp::Max),
                   .doc = "elementwise max, NaN propagates"});
  add_binary(reg, {.name = "minimum",
                   .fn = Binary::Minimum,
                   .rules = extremum_rules(ReduceOp::Min),
                   .doc = "elementwise min, NaN propagates"});
  const std::pair<const char*, Binary> comparisons[] = {{"eq", Binary::Eq}, {"ne", Binary::Ne}, {"lt", Binary::Lt},
                                                        {"le", Binary::Le}, {"gt", Binary::Gt}, {"ge", Binary::Ge}};
  for (auto [name, fn] : comparisons)
    add_binary(reg, {.name = name,
                     .fn = fn,
                     .doc = "comparison, broadcasting: 1 where true, 0 where false, in the inputs' dtype"});

  OpDef where;
  where.name = "where";
  where.num_inputs = 3;
  where.doc = "where(cond, a, b): a where cond != 0, else b; broadcasting; cond in the same dtype as a and b";
  where.meta = [](std::span<const TensorMeta> in, const OpAttrs&) {
    check_same_dtype("where", in);
    return TensorMeta{broadcast("where", in), in[1].dtype};
  };
  // The selection is elementwise, so a and b Partial with cond Replicate stays
  // Partial for every reduce op (cond itself must be whole).
  std::vector<PartialRule> where_rules;
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min})
    where_rules.push_back({{false, true, true}, op, op});
  where.dim_strategy = [where_rules](const StrategyQuery& q) { return pointwise_strategy(q, where_rules); };
  where.prefer_kept_layouts = true;
  device::bind_kernels(where, [](const device::Kernels& k) {
    return [&k](const KernelArgs& a) {
      const auto& in = a.inputs;
      return k.where(in[0], in[1], in[2], a.output_box.size);
    };
  });
  reg.add(std::move(where));
}

}  // namespace dtensor
