#include "dtensor/core/units.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "dtensor/core/error.h"

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

std::int64_t parse_bytes(std::string_view text) {
  auto fail = [&] {
    return ParseError(fmt::format("[units] '{}' is not a byte count; expected a number with an optional unit, such as "
                                  "4096, 512KiB, 1.5GiB or 2GB",
                                  text));
  };
  std::size_t end = 0;
  while (end < text.size() && (std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == '.')) ++end;
  double count = 0;
  const auto [stop, error] = std::from_chars(text.data(), text.data() + end, count);
  if (end == 0 || error != std::errc() || stop != text.data() + end) throw fail();
  std::string unit;
  for (std::size_t i = end; i < text.size(); ++i)
    if (text[i] != ' ' || !unit.empty()) unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
  static constexpr std::pair<std::string_view, double> kUnits[] = {
      {"", 1},           {"b", 1},           {"kib", 0x1p10},   {"mib", 0x1p20}, {"gib", 0x1p30},
      {"tib", 0x1p40},   {"kb", 1e3},        {"mb", 1e6},       {"gb", 1e9},     {"tb", 1e12}};
  for (const auto& [name, scale] : kUnits)
    if (unit == name) {
      const double bytes = std::floor(count * scale);
      if (!std::isfinite(bytes) || bytes >= 0x1p63) throw fail();
      return static_cast<std::int64_t>(bytes);
    }
  throw fail();
}

}  // namespace dtensor
