// Random programs: seeded chains of 10 to 30 ops on DTensors of random
// layouts (redistributed at random points too) agree with the same chain on
// full tensors. The chain stays on square n x n float64 matrices so that
// every op applies at every step; values stay bounded (tanh, sigmoid,
// scaled matmuls) so a 1e-9 tolerance is meaningful.
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <mutex>

#include "op_cases.h"
#include "support.h"

using namespace dtensor;

namespace random_programs {

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

Layout random_matrix_layout(std::mt19937_64& rng, int mesh_nd, bool partial) {
  std::vector<Placement> ps;
  for (int m = 0; m < mesh_nd; ++m) {
    int pick = static_cast<int>(rng() % (partial ? 4 : 3));
    ps.push_back(pick == 0 ? Placement(Replicate{}) : pick == 3 ? Placement(Partial{}) : Placement(Shard{pick - 1}));
  }
  return Layout(ps);
}

Program make_program(std::uint64_t seed, const Shape& mesh) {
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

std::string describe(const Program& p) {
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
using namespace random_programs;

BOOST_AUTO_TEST_SUITE(programs)

// Under MPI, the meshes of the job's size (see backend_meshes).
const std::vector<Shape> kProgramMeshes = testing::backend_meshes({{4}, {2, 2}, {2, 3}});

BOOST_DATA_TEST_CASE(random_chains_match_the_unsharded_chain, boost::unit_test::data::xrange(kProgramMeshes.size()),
                     mesh_index) {
  const Shape mesh_shape = kProgramMeshes[mesh_index];
  const int programs = 12;
  for (int k = 0; k < programs; ++k) {
    Program p = make_program(0xC0FFEEull + mesh_index * 1000 + k, mesh_shape);
    Tensor x0 = testing::uniform({p.n, p.n}, DType::Float64, p.seed);
    // The chain on full tensors.
    Tensor want = x0;
    for (const Step& s : p.steps) {
      if (s.op == "redistribute") continue;
      want = s.operand >= 0 ? call_op(s.op, {want, p.operands[s.operand]}, s.attrs) : call_op(s.op, {want}, s.attrs);
    }
    Tensor got;
    std::string error;
    std::mutex mu;
    try {
      testing::run_ranks(static_cast<int>(numel(mesh_shape)), [&](Communicator& comm) {
        DeviceMesh mesh(comm, mesh_shape);
        DTensor x = DTensor::from_local(slice_box(x0, local_box(mesh_shape, x0.shape(), p.start, mesh.coordinate())),
                                        mesh, p.start, x0.shape());
        for (const Step& s : p.steps) {
          if (s.op == "redistribute") {
            x = x.redistribute(s.reshard);
          } else if (s.operand >= 0) {
            const Tensor& b = p.operands[s.operand];
            const Layout& bl = p.operand_layouts[s.operand];
            DTensor y = DTensor::from_local(testing::source_shard(b, mesh_shape, bl, mesh.coordinate(), p.seed + 7),
                                            mesh, bl, b.shape());
            x = call_op(s.op, {x, y}, s.attrs);
          } else {
            x = call_op(s.op, {x}, s.attrs);
          }
        }
        Tensor full = x.full_tensor();
        if (testing::reports_results(comm)) {
          std::lock_guard lock(mu);
          got = full;
        }
      });
    } catch (const std::exception& e) {
      error = e.what();
    }
    BOOST_TEST_CONTEXT(describe(p)) {
      BOOST_TEST(error.empty(), error);
      if (error.empty()) BOOST_TEST(allclose(got, want, 1e-9, 1e-9), "max |diff| " << max_abs_diff(got, want));
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
