#pragma once
// The hashes of the library's value types, written once: hash_combine for
// the cache keys built of other hashes (Layout, PlanRequest, CostModel, the
// propagation cache's key) and FNV-1a for values hashed field by field
// (the op attribute structs, a layout's text in from_local's agreement
// record).
//
// Only from_local's record compares a hash across processes (each rank's
// fnv1a of its layout's text): FNV-1a is fixed by its constants, so every
// build and rank agrees. The other hashes key in-memory caches and are
// never written down.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

namespace dtensor {

/// Mixes v into seed, boost's way: seed ^= v + 2^64/phi + (seed << 6) + (seed >> 2).
inline void hash_combine(std::size_t& seed, std::uint64_t v) noexcept {
  seed ^= v + 0x9e3779b97f4a7c15ull + (seed << 6) + (seed >> 2);
}

/// FNV-1a's 64-bit offset basis and prime.
inline constexpr std::uint64_t kFnvOffsetBasis = 0xcbf29ce484222325ull;
inline constexpr std::uint64_t kFnvPrime = 0x100000001b3ull;

/// One FNV-1a step: h = (h ^ v) * prime (v a byte, or a whole word).
constexpr std::uint64_t fnv1a_mix(std::uint64_t h, std::uint64_t v) noexcept { return (h ^ v) * kFnvPrime; }

/// FNV-1a of text's bytes.
constexpr std::uint64_t fnv1a(std::string_view text) noexcept {
  std::uint64_t h = kFnvOffsetBasis;
  for (char c : text) h = fnv1a_mix(h, static_cast<unsigned char>(c));
  return h;
}

/// Mixes field values into an FNV-1a hash, one step per value: integers,
/// enums, bools, doubles (by their bits), strings (byte by byte, then the
/// length) and ranges of those (then 0xff). Attribute structs build their
/// hash() from it: `return hash_fields(dims, keepdim, p);`.
class FieldHasher {
 public:
  template <class T>
  void add(const T& v) {
    if constexpr (std::is_same_v<T, double>) {
      std::uint64_t bits;
      static_assert(sizeof bits == sizeof v);
      std::memcpy(&bits, &v, sizeof bits);
      mix(bits);
    } else if constexpr (std::is_integral_v<T> || std::is_enum_v<T>) {
      mix(static_cast<std::uint64_t>(v));
    } else if constexpr (std::is_same_v<T, std::string>) {
      for (char c : v) mix(static_cast<unsigned char>(c));
      mix(v.size());
    } else {  // a range of the above
      for (const auto& x : v) add(x);
      mix(0xffu);
    }
  }
  std::size_t value() const { return h_; }

 private:
  void mix(std::uint64_t v) { h_ = fnv1a_mix(h_, v); }
  std::size_t h_ = kFnvOffsetBasis;
};

/// The FieldHasher hash of these fields, in order.
template <class... Fields>
std::size_t hash_fields(const Fields&... fields) {
  FieldHasher h;
  (h.add(fields), ...);
  return h.value();
}

}  // namespace dtensor
