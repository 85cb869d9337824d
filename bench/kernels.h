#pragma once
// Shared by the parts of bench/kernels: one row per local kernel on a plain
// Tensor, timed next to a memcpy of the same bytes in the same run, so the
// table reads as a fraction of the machine's copy bandwidth whatever the
// machine's load. Each part (kernels_pointwise.cpp, kernels_shape.cpp) adds
// its rows; kernels.cpp prints them (and, with --json, one JSON object per
// row for bench/kernels_torch.py, which times the same ops in PyTorch).
#include <dtensor/dtensor.h>

#include <functional>
#include <string>
#include <vector>

namespace kbench {

struct Row {
  std::string group;  // "pointwise", "shape"
  std::string name;   // the op and its arguments, e.g. "gelu", "transpose(0,1)"
  dtensor::Shape shape;
  dtensor::DType dtype = dtensor::DType::Float32;
  double bytes = 0;           // bytes the kernel must read plus write at least
  double seconds = 0;         // best time of the library's call
  double memcpy_seconds = 0;  // best time of memcpy of bytes/2 (read + write = bytes)
};

/// The best of `reps` timings of fn against the best of `reps` timings of a
/// memcpy moving the same traffic (bytes/2 read and bytes/2 written), the two
/// alternating so that both see the same load.
Row measure(std::string group, std::string name, const dtensor::Shape& shape, dtensor::DType dtype, double bytes,
            int reps, const std::function<void()>& fn);

void pointwise_rows(std::vector<Row>& rows, int reps);  // kernels_pointwise.cpp
void shape_rows(std::vector<Row>& rows, int reps);      // kernels_shape.cpp

}  // namespace kbench
