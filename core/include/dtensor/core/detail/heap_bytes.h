#pragma once
// Internal: the heap a value's buffers hold beyond the value itself, as the
// caches' byte budgets estimate an entry (redistribute/src/plan.cpp,
// ops/src/dispatch.cpp).
#include <cstddef>
#include <string>
#include <vector>

#include "dtensor/core/inline_vector.h"

namespace dtensor {

template <class T>
std::size_t buffer_bytes(const std::vector<T>& v) {
  return v.capacity() * sizeof(T);
}
template <class T, std::size_t N>
std::size_t buffer_bytes(const InlineVector<T, N>& v) {
  return v.heap_bytes();
}
/// Nothing while the text fits in the string itself (15 characters in
/// libstdc++), else its capacity and the terminator.
inline std::size_t buffer_bytes(const std::string& s) { return s.capacity() > 15 ? s.capacity() + 1 : 0; }

}  // namespace dtensor
