#pragma once
// Internal to the pointwise kernels of both devices (cpu/pointwise_kernels.cpp
// and cuda/pointwise_kernels.cu): the broadcast geometry of N inputs against
// the output, computed on the host.
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "dtensor/core/shape.h"

namespace dtensor::pointwise {

// A broadcasting loop over the output in row-major order: size-1 output dims
// are dropped and adjacent dims merged where every input steps through them
// as one, so that same-shape inputs become a single contiguous row and
// (5,7)+(7,) becomes 5 rows of 7. Strides are in elements; 0 = broadcast.
template <std::size_t N>
struct Loop {
  Shape size;
  std::vector<std::array<std::int64_t, N>> stride;
  bool empty = false;
};

template <std::size_t N>
inline Loop<N> make_loop(const Shape& out, const std::array<const Shape*, N>& in) {
  const int nd = static_cast<int>(out.size());
  std::vector<std::array<std::int64_t, N>> st(static_cast<std::size_t>(nd));
  for (std::size_t k = 0; k < N; ++k) {
    const Shape& s = *in[k];
    const int off = nd - static_cast<int>(s.size());
    std::int64_t acc = 1;
    for (int d = nd - 1; d >= 0; --d) {
      const int id = d - off;
      if (id < 0) {
        st[d][k] = 0;
        continue;
      }
      st[d][k] = s[id] == 1 ? 0 : acc;
      acc *= s[id];
    }
  }
  Loop<N> loop;
  for (int d = 0; d < nd; ++d) {
    if (out[d] == 0) loop.empty = true;
    if (out[d] == 1) continue;
    if (!loop.size.empty()) {
      bool merge = true;
      for (std::size_t k = 0; k < N; ++k) merge = merge && loop.stride.back()[k] == st[d][k] * out[d];
      if (merge) {
        loop.size.back() *= out[d];
        loop.stride.back() = st[d];
        continue;
      }
    }
    loop.size.push_back(out[d]);
    loop.stride.push_back(st[d]);
  }
  return loop;
}

}  // namespace dtensor::pointwise
