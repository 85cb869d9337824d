#pragma once
// The one notation for sizes and times in everything dtensor prints.
#include <cstdint>
#include <string>

namespace dtensor {

/// "512 B", "28 KiB", "1.5 MiB".
std::string human_bytes(std::int64_t bytes);
/// "7.2 us", "1.3 ms", "2.1 s".
std::string human_seconds(double seconds);

}  // namespace dtensor
