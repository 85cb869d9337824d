// bench/kernels: the shape-op rows. Every row but the last two moves each
// element once (read + write), so its bytes are twice the output's; the
// copies all go through the one CPU strided copy (core/include/dtensor/core/detail/strided_copy.h).
// The op rows allocate their output on every call, as a caller sees them
// (the first touch of a fresh 16 MiB output is part of their time); the
// "[kernel]" rows run the strided copy alone into an output made once, which
// is what the memcpy beside them does.
// The last two rows are the GEMMs of x 64x1024 by W 4096x1024: linear(x, W)
// and matmul(x, transpose(W)), whose ratio (timed alternately) is printed on
// stderr, so that --json's stdout stays one object per row.
#include <dtensor/dtensor.h>

#include <algorithm>
#include <chrono>

#include "kernels.h"
#include "dtensor/core/detail/strided_copy.h"

namespace {

using namespace dtensor;

double bytes_of(const Shape& shape, DType dtype) {
  return static_cast<double>(numel(shape)) * static_cast<double>(itemsize(dtype));
}

// The best of `reps` alternating timings of a against b, as a / b.
double best_ratio(int reps, const std::function<void()>& a, const std::function<void()>& b) {
  auto time = [](const std::function<void()>& fn) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  double ta = 1e30, tb = 1e30;
  for (int r = 0; r < reps; ++r) {
    ta = std::min(ta, time(a));
    tb = std::min(tb, time(b));
  }
  return ta / tb;
}

}  // namespace

void kbench::shape_rows(std::vector<Row>& rows, int reps) {
  const DType f32 = DType::Float32, bf16 = DType::BFloat16;
  Tensor sink;  // keeps each result alive until the next call, as a caller would
  {
    const Shape s{4096, 1024};
    const Tensor x = Tensor::rand(s, f32, 1);
    rows.push_back(
        measure("shape", "transpose(0,1)", s, f32, 2 * bytes_of(s, f32), reps, [&] { sink = transpose(x, 0, 1); }));
  }
  {
    const Shape s{16, 256, 16, 64};
    const Tensor x = Tensor::rand(s, f32, 2);
    rows.push_back(measure("shape", "permute(0,2,1,3)", s, f32, 2 * bytes_of(s, f32), reps, [&] {
      sink = permute(x, {0, 2, 1, 3});
    }));
  }
  {
    const Shape s{4096, 1024};
    const Tensor x = Tensor::rand(s, f32, 3);
    rows.push_back(measure("shape", "narrow(1,0,512)", s, f32, 2 * bytes_of({4096, 512}, f32), reps,
                           [&] { sink = narrow(x, 1, 0, 512); }));
    // An inner box, as redistribution packs a shard of a 2-d mesh.
    const Box box{{1024, 256}, {2048, 512}};
    rows.push_back(measure("shape", "slice_box(inner half)", s, f32, 2 * bytes_of(box.size, f32), reps,
                           [&] { sink = slice_box(x, box); }));
  }
  {
    const Shape half{4096, 512};
    const Tensor a = Tensor::rand(half, f32, 4), b = Tensor::rand(half, f32, 5);
    rows.push_back(measure("shape", "cat(dim=1) of 2", half, f32, 4 * bytes_of(half, f32), reps, [&] {
      sink = cat({a, b}, 1);
    }));
  }
  {
    const Shape s{4096, 1024};
    const Tensor x = Tensor::rand(s, bf16, 6);
    rows.push_back(
        measure("shape", "transpose(0,1)", s, bf16, 2 * bytes_of(s, bf16), reps, [&] { sink = transpose(x, 0, 1); }));
  }
  for (DType dtype : {f32, bf16}) {
    const Shape s{4096, 1024}, out_shape{1024, 4096};
    const Tensor x = Tensor::rand(s, dtype, 9);
    Tensor out = Tensor::zeros(out_shape, dtype);
    const Shape src_strides{1, 1024}, dst_strides = row_major_strides(out_shape);
    rows.push_back(measure("shape", "transpose(0,1) [kernel]", s, dtype, 2 * bytes_of(s, dtype), reps, [&] {
      cpu::copy_strided(x.bytes(), src_strides, out.bytes(), dst_strides, out_shape, itemsize(dtype));
    }));
  }
  {
    const Shape xs{64, 1024}, ws{4096, 1024};
    const Tensor x = Tensor::rand(xs, f32, 7), w = Tensor::rand(ws, f32, 8);
    const double gemm_bytes = bytes_of(xs, f32) + bytes_of(ws, f32) + bytes_of({64, 4096}, f32);
    auto lin = [&] { sink = linear(x, w); };
    auto mt = [&] { sink = matmul(x, transpose(w, 0, 1)); };
    rows.push_back(measure("shape", "linear(x,W) [gemm]", ws, f32, gemm_bytes, reps, lin));
    rows.push_back(measure("shape", "matmul(x,transpose(W))", ws, f32, gemm_bytes, reps, mt));
    fmt::
        print(stderr,
              "x 64x1024, W 4096x1024 f32: matmul(x, transpose(W)) / linear(x, W) = {:.2f} (best of {}, alternating)\n",
              best_ratio(reps, mt, lin), reps);
  }
}
