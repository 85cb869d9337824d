// Registering an op from outside the library: "softclip", y = x / (1 + |x|),
// elementwise. One registration gives it a shape rule, a sharding strategy
// and a CPU kernel; the library then runs it on any layout, redistributing
// its input only when the strategy asks for it. A backward rule, written
// with the same front-end functions, makes it differentiable on Tensors and
// DTensors alike.
#include <dtensor/dtensor.h>

#include <atomic>
#include <cmath>
#include <type_traits>

using namespace dtensor;

namespace {

// Returns the registered op: a handle to call it by, without a lookup.
Op register_softclip() {
  OpDef def;
  def.name = "softclip";
  def.num_inputs = 1;
  def.doc = "x / (1 + |x|), elementwise";
  def.meta = [](std::span<const TensorMeta> in, const OpAttrs&) { return in[0]; };
  // Elementwise and not linear: a shard stays a shard, a replica a replica,
  // but a Partial sum must be reduced first (softclip(a)+softclip(b) is not
  // softclip(a+b)), so no candidate accepts Partial. The options are given
  // per mesh dim; the registry expands them to the whole mesh.
  def.dim_strategy = [](const StrategyQuery& q) {
    std::vector<DimStrategy> per_dim{{{Replicate{}}, Replicate{}}};
    for (std::int64_t d = 0; d < static_cast<std::int64_t>(q.inputs[0].shape.size()); ++d)
      per_dim.push_back({{Shard{d}}, Shard{d}});
    return per_dim;
  };
  // A CPU kernel only: on CUDA tensors the op says it has no cuda kernel.
  def.cpu_kernel = [](const KernelArgs& a) {
    Tensor out = Tensor::empty(a.inputs[0].shape(), a.inputs[0].dtype());
    visit_dtype(out.dtype(), [&](auto zero) {
      using T = decltype(zero);
      const T* x = a.inputs[0].data_as<T>();
      T* y = out.data_as<T>();
      for (std::int64_t i = 0; i < out.numel(); ++i)
        y[i] = static_cast<T>(static_cast<double>(x[i]) / (1.0 + std::abs(static_cast<double>(x[i]))));
    });
    return out;
  };
  // d/dx x / (1 + |x|) = 1 / (1 + |x|)^2. One generic rule serves Tensor
  // and DTensor: on DTensors each op in it is dispatched and planned like
  // any other (and shows in ExplainScope as "[backward of softclip]").
  def.backward = make_backward([](const auto& a) {
    using X = std::decay_t<decltype(a.output)>;
    const X d = add(abs(a.inputs[0]), 1.0);
    return InputGrads<X>{div(a.grad, mul(d, d))};
  });
  return OpRegistry::global().add(std::move(def));
}

// The gradient of sum(softclip(x) * w) through the op's backward: on a
// plain tensor against central finite differences, and on a sharded x
// (gathered) against the plain gradient. Returns the failures (rank 0
// prints them).
std::int64_t check_gradient(const DeviceMesh& mesh, Op softclip, const Tensor& full) {
  std::int64_t failures = 0;
  const bool report = mesh.comm().rank() == 0;
  const Tensor w = Tensor::rand(full.shape(), DType::Float64, 8);
  Tensor x = full.clone().requires_grad_();
  sum(mul(call_op(softclip, {x}), w)).backward();
  const Tensor grad = *x.grad();
  double worst = 0;
  {
    NoGradGuard no_grad;
    const double eps = 1e-6;
    auto loss = [&](const Tensor& v) { return sum(mul(call_op(softclip, {v}), w)).get({}); };
    for (std::int64_t k = 0; k < full.numel(); ++k) {
      Tensor plus = full.clone(), minus = full.clone();
      plus.data_as<double>()[k] += eps;
      minus.data_as<double>()[k] -= eps;
      const double numeric = (loss(plus) - loss(minus)) / (2 * eps);
      worst = std::max(worst, std::abs(numeric - grad.data_as<double>()[k]));
    }
  }
  if (report) fmt::print("gradient of softclip: worst |backward - finite difference| {:.1e}\n", worst);
  if (worst > 1e-8) {
    if (report) fmt::print("  WRONG gradient on a plain tensor\n");
    ++failures;
  }
  DTensor dx = distribute_tensor(full, mesh, Layout::parse("S(0),S(1)"));
  dx.requires_grad_();
  sum(mul(call_op(softclip, {dx}), distribute_tensor(w, mesh, Layout::parse("R,R")))).backward();
  Tensor got = dx.grad()->full_tensor();
  if (report) fmt::print("gradient of softclip on S(0),S(1) comes back {}\n", dx.grad()->placements());
  if (!allclose(got, grad, 1e-12)) {
    if (report) fmt::print("  WRONG gradient on a DTensor\n");
    ++failures;
  }
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  const Op softclip = register_softclip();
  std::atomic<std::int64_t> verdict{0};  // thread ranks all store the same value
  const int rc =
      launch(argc, argv,
             [&](Communicator& world) {
               std::int64_t failures = 0;
               DeviceMesh mesh(world, {2, 2});
               Tensor full = Tensor::rand({6, 5}, DType::Float64, 7);
               Tensor expected = call_op("softclip", {full});  // by name, on a plain tensor
               for (const char* text : {"S(0),S(1)", "R,S(0)", "P(sum),R"}) {
                 DTensor x = text == std::string("P(sum),R")
                                 ? DTensor::from_local(world.rank() < 2 ? full : Tensor::zeros({6, 5}, DType::Float64),
                                                       mesh, Layout::parse(text), full.shape())
                                 : distribute_tensor(world.rank() == 0 ? full : Tensor(), mesh, Layout::parse(text));
                 std::vector<std::string> lines;
                 DTensor y = [&] {
                   ExplainScope explain([&](const std::string& line) { lines.push_back(line); });
                   return call_op(softclip, {x});  // by handle
                 }();
                 Tensor got = y.full_tensor();
                 if (world.rank() == 0) {
                   for (auto& l : lines) fmt::print("{}\n", l);
                   if (!allclose(got, expected, 1e-12)) {
                     fmt::print("  WRONG result for {}\n", text);
                     ++failures;
                   }
                 }
               }
               failures += check_gradient(mesh, softclip, full);
               world.all_reduce(std::span(&failures, 1), ReduceOp::Sum);
               if (world.rank() == 0)
                 fmt::print("{}\n", failures ? "softclip FAILED"
                                             : "softclip and its gradient match the unsharded op on every layout");
               verdict.store(failures);
             },
             {.default_ranks = 4});
  return rc != 0 ? rc : (verdict.load() ? 1 : 0);
}
