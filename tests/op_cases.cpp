// The registry of generated op samples (op_cases.h), shared by the sharded
// op suite (test_ops) and the CUDA op suite (test_cuda_ops).
#include "op_cases.h"

#include <algorithm>

namespace dtensor::testing {

std::map<std::string, SampleGenerator>& op_samples() {
  static std::map<std::string, SampleGenerator> samples;
  return samples;
}

namespace {

std::vector<Layout> layout_options(const Shape& mesh, const Tensor& t, bool partial) {
  std::vector<Placement> per_dim{Replicate{}};
  for (int d = 0; d < t.dim(); ++d) per_dim.push_back(Shard{d});
  if (partial && is_floating(t.dtype())) per_dim.push_back(Partial{ReduceOp::Sum});
  std::vector<Layout> out;
  std::vector<std::size_t> pick(mesh.size(), 0);
  while (true) {
    std::vector<Placement> ps;
    for (auto p : pick) ps.push_back(per_dim[p]);
    out.emplace_back(ps);
    int m = static_cast<int>(mesh.size()) - 1;
    while (m >= 0 && ++pick[m] == per_dim.size()) pick[m--] = 0;
    if (m < 0) break;
  }
  return out;
}

}  // namespace

std::vector<std::vector<Layout>> input_layout_combos(const Shape& mesh_shape, const OpSample& s) {
  std::vector<std::vector<Layout>> options;
  for (std::size_t i = 0; i < s.inputs.size(); ++i) {
    bool fixed = std::find(s.fixed_inputs.begin(), s.fixed_inputs.end(), static_cast<int>(i)) != s.fixed_inputs.end();
    options.push_back(fixed ? std::vector<Layout>{Layout::replicated(static_cast<int>(mesh_shape.size()))}
                            : layout_options(mesh_shape, s.inputs[i], s.allow_partial));
  }
  std::vector<std::vector<Layout>> combos{{}};
  for (auto& opts : options) {
    std::vector<std::vector<Layout>> next;
    for (auto& c : combos)
      for (auto& l : opts) {
        next.push_back(c);
        next.back().push_back(l);
      }
    combos = std::move(next);
  }
  return combos;
}

Tensor uniform(const Shape& shape, DType dtype, std::uint64_t seed, double lo, double hi) {
  Tensor u = Tensor::rand(shape, DType::Float64, seed);
  Tensor t = Tensor::empty(shape, dtype);
  visit_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    const double* p = u.data_as<double>();
    T* q = t.data_as<T>();
    for (std::int64_t i = 0; i < t.numel(); ++i) q[i] = static_cast<T>(lo + (hi - lo) * p[i]);
  });
  return t;
}

}  // namespace dtensor::testing
