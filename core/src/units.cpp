#include "dtensor/core/units.h"

#include <fmt/format.h>

namespace dtensor {

std::string human_bytes(std::int64_t b) {
  if (b < 1024) return fmt::format("{} B", b);
  double v = static_cast<double>(b);
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  int u = -1;
  while (v >= 1024 && u < 3) {
    v /= 1024;
    ++u;
  }
  return fmt::format("{:.3g} {}", v, units[u]);
}

std::string human_seconds(double s) {
  if (s == 0) return "0 s";
  if (s < 1e-3) return fmt::format("{:.3g} us", s * 1e6);
  if (s < 1) return fmt::format("{:.3g} ms", s * 1e3);
  return fmt::format("{:.3g} s", s);
}

}  // namespace dtensor
