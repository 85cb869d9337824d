#pragma once
// The per-op generated tests. Each op family's test file registers, for
// every op it defines, a generator of sample calls (inputs + attrs); the
// harness in test_ops.cpp runs each sample over every combination of input
// placements (R, S(d) for each dim, P(sum)) on a 1-D mesh of 4, a 2x2 and a
// 2x3 mesh, and checks the DTensor result's full tensor against the op on
// the full tensors. A registered op with no generator fails the suite.
#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <dtensor/dtensor.h>

namespace dtensor::testing {

struct OpSample {
  std::vector<Tensor> inputs;  // full (unsharded) inputs
  OpAttrs attrs;
  /// Tolerance for comparing with the unsharded result: |got - want| <= atol + rtol*|want|.
  double rtol = 1e-5;
  double atol = 1e-6;
  /// Inputs whose placements are not varied (kept Replicate), e.g. integer
  /// index tensors that a Partial would corrupt.
  std::vector<int> fixed_inputs;
  /// Whether a Partial(sum) source may be tried for each varied input (off
  /// for inputs whose dtype is int and whose addends would overflow, etc.).
  bool allow_partial = true;
};

using SampleGenerator = std::function<std::vector<OpSample>(std::mt19937_64& rng)>;

/// op name -> generator; filled by static registrations in the family test files.
std::map<std::string, SampleGenerator>& op_samples();

struct RegisterSamples {
  RegisterSamples(const std::string& op, SampleGenerator gen) { op_samples()[op] = std::move(gen); }
};

/// Every combination of input layouts the op suite tries for `s` on a mesh
/// of `mesh_shape`: per mesh dim, R, S(d) for each tensor dim and (floating
/// inputs, allow_partial) P(sum); fixed inputs stay Replicate. In a fixed
/// order (callers sample it, seeded).
std::vector<std::vector<Layout>> input_layout_combos(const Shape& mesh_shape, const OpSample& s);

/// Random float tensor with values in [lo, hi) (seeded, any dtype).
Tensor uniform(const Shape& shape, DType dtype, std::uint64_t seed, double lo = -1, double hi = 1);

}  // namespace dtensor::testing
