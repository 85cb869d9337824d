#pragma once
// The seeded random op chains shared by the forward suite
// (test_random_programs.cpp) and the backward suite
// (test_autograd_programs.cpp): square n x n float64 matrices, so every op
// applies at every step, values kept bounded (tanh, sigmoid, scaled
// matmuls), random layouts and redistributions along the way.
#include <random>
#include <string>
#include <vector>

#include "op_cases.h"
#include "support.h"

namespace random_programs {

using namespace dtensor;

struct Step {
  std::string op;
  OpAttrs attrs;
  int operand = -1;  // index into operands, for binary ops
  Layout reshard;    // used when op == "redistribute"
};

struct Program {
  std::uint64_t seed;
  Shape mesh;
  std::int64_t n;
  Layout start;
  std::vector<Tensor> operands;
  std::vector<Layout> operand_layouts;
  std::vector<Step> steps;
};

inline Layout random_matrix_layout(std::mt19937_64& rng, int mesh_nd, bool partial) {
  std::vector<Placement> ps;
  for (int m = 0; m < mesh_nd; ++m) {
    int pick = static_cast<int>(rng() % (partial ? 4 : 3));
    ps.push_back(pick == 0 ? Placement(Replicate{}) : pick == 3 ? Placement(Partial{}) : Placement(Shard{pick - 1}));
  }
  return Layout(ps);
}

inline Program make_program(std::uint64_t seed, const Shape& mesh) {
  std::mt19937_64 rng(seed);
  Program p{seed, mesh, 3 + static_cast<std::int64_t>(rng() % 5), {}, {}, {}, {}};
  const int mnd = static_cast<int>(mesh.size());
  p.start = random_matrix_layout(rng, mnd, false);
  const int length = 10 + static_cast<int>(rng() % 21);
  static const char* unary[] = {"neg",       "relu",    "tanh",       "sigmoid",   "abs",
                                "transpose", "softmax", "mul_scalar", "add_scalar"};
  static const char* binary[] = {"add", "sub", "mul", "maximum", "minimum", "matmul"};
  for (int i = 0; i < length; ++i) {
    Step s;
    int kind = static_cast<int>(rng() % 10);
    if (kind < 5) {
      s.op = unary[rng() % std::size(unary)];
      if (s.op == "transpose") s.attrs = TransposeAttrs{.dim0 = 0, .dim1 = 1};
      if (s.op == "softmax") s.attrs = DimAttrs{.dim = static_cast<std::int64_t>(rng() % 2)};
      if (s.op == "mul_scalar") s.attrs = ScalarAttrs{.value = 0.5 + static_cast<double>(rng() % 4) / 4};
      if (s.op == "add_scalar") s.attrs = ScalarAttrs{.value = -0.25};
    } else if (kind < 9) {
      s.op = binary[rng() % std::size(binary)];
      s.operand = static_cast<int>(p.operands.size());
      double scale = s.op == "matmul" ? 1.0 / static_cast<double>(p.n) : 1.0;
      p.operands.push_back(testing::uniform({p.n, p.n}, DType::Float64, seed * 100 + i, -scale, scale));
      p.operand_layouts.push_back(random_matrix_layout(rng, mnd, true));
    } else {
      s.op = "redistribute";
      s.reshard = random_matrix_layout(rng, mnd, false);
    }
    p.steps.push_back(std::move(s));
  }
  return p;
}

inline std::string describe(const Program& p) {
  std::string out = fmt::format("seed {} mesh {} n {} start {}:", p.seed, fmt::join(p.mesh, "x"), p.n, p.start);
  for (const Step& s : p.steps) {
    if (s.op == "redistribute")
      out += fmt::format(" ->[{}]", s.reshard);
    else if (s.operand >= 0)
      out += fmt::format(" {}(x, [{}])", s.op, p.operand_layouts[s.operand]);
    else
      out += fmt::format(" {}", s.op);
  }
  return out;
}

}  // namespace random_programs
