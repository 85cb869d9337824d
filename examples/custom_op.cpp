// Registering an op from outside the library: "softclip", y = x / (1 + |x|),
// elementwise. One registration gives it a shape rule, a sharding strategy
// and a CPU kernel; the library then runs it on any layout, redistributing
// its input only when the strategy asks for it.
#include <dtensor/dtensor.h>

#include <atomic>

#include <cmath>

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
  return OpRegistry::global().add(std::move(def));
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
               world.all_reduce(&failures, &failures, 1, DType::Int64, ReduceOp::Sum);
               if (world.rank() == 0)
                 fmt::print("{}\n", failures ? "softclip FAILED" : "softclip matches the unsharded op on every layout");
               verdict.store(failures);
             },
             {.default_ranks = 4});
  return rc != 0 ? rc : (verdict.load() ? 1 : 0);
}
