// transpose_plane (transpose_plane.h) without Google Highway: 16-byte
// generic vectors, which every x86-64 and Arm CPU has, and plain stores.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "transpose_plane.h"

namespace dtensor::cpu {
namespace {

struct RowStore {
  void operator()(const void* from, void* to, std::int64_t bytes) const {
    std::memcpy(to, from, static_cast<std::size_t>(bytes));
  }
};

#include "transpose_plane-inl.h"

}  // namespace

void transpose_plane(const std::byte* s, std::int64_t sb, std::byte* d, std::int64_t da, std::int64_t na,
                     std::int64_t nb, std::size_t itemsize, bool /*stream*/) {
  transpose_plane_bytes<16>(s, sb, d, da, na, nb, itemsize, RowStore{});
}

}  // namespace dtensor::cpu
