#pragma once
// The one notation for sizes and times in everything dtensor prints.
#include <cstdint>
#include <string>
#include <string_view>

namespace dtensor {

/// "512 B", "28 KiB", "1.5 MiB".
std::string human_bytes(std::int64_t bytes);
/// "7.2 us", "1.3 ms", "2.1 s".
std::string human_seconds(double seconds);
/// A byte count as people write one: "4096", "4096B", "512KiB", "1.5 GiB"
/// (powers of 1024), "2GB", "300 MB" (powers of 1000); the unit's case is
/// free, a space may separate it, and a fraction rounds down to whole
/// bytes. ParseError naming the text unless it is a finite count >= 0 of
/// at most 2^63 - 1 bytes.
std::int64_t parse_bytes(std::string_view text);

}  // namespace dtensor
