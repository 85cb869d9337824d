// Every registered op against the CPU, on the same generated samples as the
// sharded op suite (tests/samples_*.cpp):
//   - on any machine: each floating sample in bf16 and f16 on the CPU gives
//     exactly the f32 op on the widened inputs, rounded once (the dispatch
//     fallback that lets the CPU compute 16-bit dtypes);
//   - on a GPU (skipped, and counted, without one): each sample run on CUDA
//     tensors matches the CPU result in its own dtype and in bf16; and each
//     sample runs sharded over four simulated GPU ranks (a 2x2 mesh on one
//     device) against the unsharded CPU result; the in-place ops write
//     into device storage.
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <mutex>
#include <random>
#include <string>
#include <vector>

#include <dtensor/dtensor.h>

#include "checks.h"
#include "dtensor/core/cuda.h"
#include "dtensor/core/hash.h"
#include "op_cases.h"
#include "support.h"

using namespace dtensor;
namespace utf = boost::unit_test;

namespace cuda_ops_test {

std::vector<std::string> registered_ops() { return OpRegistry::global().names(); }

std::vector<testing::OpSample> samples_of(const std::string& op, std::uint64_t& seed) {
  seed = fnv1a(op) % 100000;
  std::mt19937_64 rng(seed);
  auto found = testing::op_samples().find(op);
  BOOST_TEST_REQUIRE((found != testing::op_samples().end()), "op '" << op << "' has no generated cases in tests/");
  return found->second(rng);
}

bool all_floating(const testing::OpSample& s) {
  for (const Tensor& t : s.inputs)
    if (!is_floating(t.dtype())) return false;
  return true;
}

// The inputs with their floating tensors converted to `dtype` (integer index
// tensors stay as they are).
std::vector<Tensor> as_dtype(const std::vector<Tensor>& inputs, DType dtype) {
  std::vector<Tensor> out;
  for (const Tensor& t : inputs) out.push_back(is_floating(t.dtype()) ? t.to(dtype) : t);
  return out;
}

std::vector<Tensor> on_device(const std::vector<Tensor>& inputs) {
  std::vector<Tensor> out;
  for (const Tensor& t : inputs) out.push_back(t.to(Device::CUDA));
  return out;
}

// Ops whose attrs carry a dtype of their own (to): the 16-bit variant keeps
// the sample's attrs, so widening applies to the input only.
bool has_floating_input(const testing::OpSample& s) {
  for (const Tensor& t : s.inputs)
    if (is_floating(t.dtype())) return true;
  return false;
}

}  // namespace cuda_ops_test
using namespace cuda_ops_test;

BOOST_AUTO_TEST_SUITE(sixteen_bit_on_the_cpu)

BOOST_DATA_TEST_CASE(each_op_in_bf16_and_f16_is_the_f32_op_rounded_once, utf::data::make(registered_ops()), op) {
  std::uint64_t seed = 0;
  const auto samples = samples_of(op, seed);
  std::size_t checked = 0;
  for (std::size_t si = 0; si < samples.size(); ++si) {
    const auto& s = samples[si];
    if (!has_floating_input(s)) continue;
    for (DType d : {DType::BFloat16, DType::Float16}) {
      const std::vector<Tensor> narrow = as_dtype(s.inputs, d);
      Tensor got;
      try {
        got = call_op(op, std::span<const Tensor>(narrow), s.attrs);
      } catch (const std::exception& e) {
        BOOST_ERROR("op " << op << " sample " << si << " (seed " << seed << ") in " << dtype_name(d) << ": "
                          << e.what());
        continue;
      }
      const std::vector<Tensor> wide = as_dtype(narrow, DType::Float32);
      OpAttrs attrs = s.attrs;
      if (const auto* to = attrs.get_if<ToAttrs>()) attrs = ToAttrs{.dtype = cpu_compute_dtype(to->dtype)};
      const Tensor want32 = call_op(op, std::span<const Tensor>(wide), attrs);
      // A floating result comes back in the inputs' 16-bit dtype (unless the
      // op names its own output dtype, as `to` does).
      const DType want_dtype = want32.dtype() == DType::Float32 && op != "to" ? d : want32.dtype();
      BOOST_TEST((got.dtype() == want_dtype), "op " << op << " sample " << si << " in " << dtype_name(d) << " gave "
                                                    << dtype_name(got.dtype()) << ", expected "
                                                    << dtype_name(want_dtype));
      const Tensor want = want32.to(want_dtype);
      BOOST_TEST(equal(got, want), "op " << op << " sample " << si << " (seed " << seed << ") in " << dtype_name(d)
                                         << ": max |diff| " << max_abs_diff(got, want));
      ++checked;
    }
  }
  BOOST_TEST_MESSAGE("op " << op << ": " << checked << " 16-bit samples checked");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(on_a_gpu, *utf::precondition(testing::needs_gpu))

BOOST_DATA_TEST_CASE(each_op_on_cuda_matches_the_cpu, utf::data::make(registered_ops()), op) {
  std::uint64_t seed = 0;
  const auto samples = samples_of(op, seed);
  for (std::size_t si = 0; si < samples.size(); ++si) {
    const auto& s = samples[si];
    const Tensor want = call_op(op, std::span<const Tensor>(s.inputs), s.attrs);
    const std::vector<Tensor> dev = on_device(s.inputs);
    Tensor got;
    try {
      got = call_op(op, std::span<const Tensor>(dev), s.attrs);
    } catch (const std::exception& e) {
      BOOST_ERROR("op " << op << " sample " << si << " (seed " << seed << ") on cuda: " << e.what());
      continue;
    }
    BOOST_TEST((got.device() == Device::CUDA), "op " << op << " sample " << si << " left the device");
    const Tensor host = got.to(Device::CPU);
    // The GPU sums in another order and uses its own libm: a little looser.
    BOOST_TEST(allclose(host, want, std::max(s.rtol, 1e-4), std::max(s.atol, 1e-5)),
               "op " << op << " sample " << si << " (seed " << seed << ") on cuda: max |diff| "
                     << max_abs_diff(host, want));
    if (!has_floating_input(s) || !all_floating(s)) continue;
    // bf16 on the GPU against bf16 on the CPU (f32 math rounded once).
    const std::vector<Tensor> narrow = as_dtype(s.inputs, DType::BFloat16);
    const Tensor want16 = call_op(op, std::span<const Tensor>(narrow), s.attrs);
    const Tensor got16 = call_op(op, std::span<const Tensor>(on_device(narrow)), s.attrs).to(Device::CPU);
    BOOST_TEST(allclose(got16.to(DType::Float32), want16.to(DType::Float32), 2e-2, 2e-2),
               "op " << op << " sample " << si << " (seed " << seed << ") in bf16 on cuda: max |diff| "
                     << max_abs_diff(got16.to(DType::Float32), want16.to(DType::Float32)));
  }
}

BOOST_DATA_TEST_CASE(each_op_sharded_over_simulated_gpu_ranks_matches_the_cpu, utf::data::make(registered_ops()), op) {
  std::uint64_t seed = 0;
  const auto samples = samples_of(op, seed);
  const Shape mesh_shape{2, 2};
  std::mt19937_64 rng(seed);
  std::vector<std::string> failures;
  for (std::size_t si = 0; si < samples.size(); ++si) {
    const auto& s = samples[si];
    const Tensor want = call_op(op, std::span<const Tensor>(s.inputs), s.attrs);
    // One random layout per input (fixed inputs stay replicated), three draws.
    std::vector<std::vector<Layout>> combos;
    for (int draw = 0; draw < 3; ++draw) {
      std::vector<Layout> combo;
      for (std::size_t i = 0; i < s.inputs.size(); ++i) {
        const bool fixed =
            std::find(s.fixed_inputs.begin(), s.fixed_inputs.end(), static_cast<int>(i)) != s.fixed_inputs.end();
        combo.push_back(
            fixed ? Layout::replicated(2)
                  : testing::random_layout(rng, 2, s.inputs[i].dim(), ReduceOp::Sum, s.allow_partial ? 2 : 0));
      }
      combos.push_back(std::move(combo));
    }
    std::string current;
    ThreadsOptions options;
    options.device = Device::CUDA;
    try {
      run_threads(
          4,
          [&](Communicator& comm) {
            DeviceMesh mesh(comm, mesh_shape);
            for (const auto& combo : combos) {
              if (comm.rank() == 0)
                current = fmt::format("op {} sample {} (seed {}) inputs {}", op, si, seed, fmt::join(combo, " | "));
              std::vector<DTensor> args;
              for (std::size_t i = 0; i < combo.size(); ++i) {
                const Layout l = validate_layout(combo[i], mesh_shape, s.inputs[i].shape());
                const Tensor local =
                    testing::source_shard(s.inputs[i], mesh_shape, l, mesh.coordinate(), seed + i).to(Device::CUDA);
                args.push_back(DTensor::from_local(local, mesh, l, s.inputs[i].shape()));
              }
              const Tensor got = call_op(op, std::span<const DTensor>(args), s.attrs).full_tensor().to(Device::CPU);
              if (comm.rank() == 0 && !allclose(got, want, std::max(s.rtol, 1e-4), std::max(s.atol, 1e-5)))
                failures.push_back(fmt::format("{}: max |diff| {}", current, max_abs_diff(got, want)));
            }
          },
          options);
    } catch (const std::exception& e) {
      failures.push_back(fmt::format("{}: {}", current, e.what()));
    }
  }
  testing::check_no_failures(failures);
}

// An op registered with a CPU kernel only says so on CUDA tensors, naming
// itself and the device, instead of running anything.
BOOST_AUTO_TEST_CASE(an_op_without_a_cuda_kernel_names_itself_and_the_device) {
  if (!OpRegistry::global().contains("test_cpu_only")) {
    OpDef d;
    d.name = "test_cpu_only";
    d.meta = [](std::span<const TensorMeta> in, const OpAttrs&) { return in[0]; };
    d.dim_strategy = [](const StrategyQuery&) { return std::vector<DimStrategy>{{{Replicate{}}, Replicate{}}}; };
    d.cpu_kernel = [](const KernelArgs& a) { return a.inputs[0].clone(); };
    OpRegistry::global().add(std::move(d));
  }
  const Tensor x = Tensor::ones({2, 3}, DType::Float32, Device::CUDA);
  testing::check_throws<UnsupportedError>([&] { call_op("test_cpu_only", {x}); }, "[test_cpu_only] has no cuda kernel");
  BOOST_TEST(equal(call_op("test_cpu_only", {Tensor::ones({2, 3})}), Tensor::ones({2, 3})));
}

// add_ and its siblings write into the tensor's own device storage: a
// device copy, never a host memcpy of device pointers.
BOOST_AUTO_TEST_CASE(in_place_ops_write_into_device_storage) {
  Tensor a = Tensor::from_vector<double>({1, 2, 3}, {3}).to(Device::CUDA);
  Tensor alias = a;  // shares storage
  add_(a, Tensor::from_vector<double>({10, 20, 30}, {3}).to(Device::CUDA));
  mul_(a, 2.0);
  BOOST_TEST((a.device() == Device::CUDA));
  BOOST_TEST(equal(alias.to(Device::CPU), Tensor::from_vector<double>({22, 44, 66}, {3})));

  // Sharded over four simulated GPU ranks: each rank's device shard is
  // updated in place and the layout is kept.
  std::vector<std::string> failures;
  std::mutex mu;
  ThreadsOptions options;
  options.device = Device::CUDA;
  const Tensor x_full = Tensor::arange({6, 4}, DType::Float64), y_full = Tensor::full({6, 4}, 0.5, DType::Float64);
  try {
    run_threads(
        4,
        [&](Communicator& comm) {
          DeviceMesh mesh(comm, {2, 2});
          DTensor x = distribute_tensor(comm.rank() == 0 ? x_full : Tensor(), mesh, Layout::parse("S(0),S(1)"));
          DTensor y = distribute_tensor(comm.rank() == 0 ? y_full : Tensor(), mesh, Layout::parse("R,S(0)"));
          Tensor local = x.to_local();  // shares x's storage
          sub_(x, y);
          mul_(x, 2.0);
          Tensor got = x.full_tensor().to(Device::CPU);
          std::lock_guard lock(mu);
          if (!(x.placements() == Layout::parse("S(0),S(1)")))
            failures.push_back(fmt::format("layout became {}", x.placements()));
          if (x.to_local().device() != Device::CUDA) failures.push_back("the shard left the device");
          if (!equal(local.to(Device::CPU), x.to_local().to(Device::CPU)))
            failures.push_back("the rank's shard was not updated in place");
          if (!equal(got, (x_full - y_full) * 2.0)) failures.push_back("wrong values");
        },
        options);
  } catch (const std::exception& e) {
    failures.push_back(e.what());
  }
  testing::check_no_failures(failures);
}

BOOST_AUTO_TEST_SUITE_END()
