// LinkModel (dtensor/mesh/work.h): the alpha-beta time of a call, and the
// "10us,5GB/s" form --link takes.
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "dtensor/core/error.h"
#include "dtensor/mesh/work.h"

namespace dtensor {

std::chrono::nanoseconds LinkModel::time_for(std::uint64_t bytes) const {
  const double transfer_ns = static_cast<double>(bytes) / bytes_per_second * 1e9;
  return latency + std::chrono::nanoseconds(static_cast<std::int64_t>(std::ceil(transfer_ns)));
}

namespace {

// "12.5" at the front of `text`, the rest after it in `unit`.
bool leading_number(std::string_view text, double& value, std::string_view& unit) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || !std::isfinite(value)) return false;
  unit = text.substr(static_cast<std::size_t>(end - text.data()));
  return true;
}

template <class Table>
bool scale_of(const Table& table, std::string_view unit, double& scale) {
  for (const auto& [name, factor] : table)
    if (unit == name) {
      scale = factor;
      return true;
    }
  return false;
}

constexpr std::pair<std::string_view, double> kTimeUnits[] = {{"ns", 1}, {"us", 1e3}, {"ms", 1e6}, {"s", 1e9}};
constexpr std::pair<std::string_view, double> kRateUnits[] = {
    {"B/s", 1},         {"KB/s", 1e3},           {"MB/s", 1e6},
    {"GB/s", 1e9},      {"KiB/s", 1024.0},       {"MiB/s", 1024.0 * 1024},
    {"GiB/s", 1024.0 * 1024 * 1024}};

}  // namespace

LinkModel LinkModel::parse(std::string_view text) {
  const auto fail = [&](std::string_view why) {
    return ParseError(fmt::format("link '{}': {}; expected a latency and a bandwidth such as '10us,5GB/s' (latency in "
                                  "ns, us, ms or s; bandwidth in B/s, KB/s, MB/s, GB/s, KiB/s, MiB/s or GiB/s)",
                                  text, why));
  };
  const auto comma = text.find(',');
  if (comma == std::string_view::npos) throw fail("no comma between the latency and the bandwidth");
  double latency = 0, rate = 0, time_scale = 0, rate_scale = 0;
  std::string_view time_unit, rate_unit;
  if (!leading_number(text.substr(0, comma), latency, time_unit) || !scale_of(kTimeUnits, time_unit, time_scale))
    throw fail(fmt::format("bad latency '{}'", text.substr(0, comma)));
  if (!leading_number(text.substr(comma + 1), rate, rate_unit) || !scale_of(kRateUnits, rate_unit, rate_scale))
    throw fail(fmt::format("bad bandwidth '{}'", text.substr(comma + 1)));
  if (latency < 0) throw fail("a negative latency");
  if (rate <= 0) throw fail("a bandwidth that is not positive");
  LinkModel link;
  link.latency = std::chrono::nanoseconds(static_cast<std::int64_t>(std::llround(latency * time_scale)));
  link.bytes_per_second = rate * rate_scale;
  return link;
}

std::string LinkModel::str() const {
  std::string time = fmt::format("{}ns", latency.count());
  for (const auto& [name, factor] : kTimeUnits) {
    const auto whole = static_cast<std::int64_t>(factor);
    if (latency.count() % whole == 0) time = fmt::format("{}{}", latency.count() / whole, name);
  }
  // The largest decimal unit that keeps the rate at least 1 (10GB/s, 250MB/s).
  std::string rate = fmt::format("{:g}B/s", bytes_per_second);
  for (const auto& [name, factor] : kRateUnits)
    if (name.find('i') == std::string_view::npos && bytes_per_second >= factor)
      rate = fmt::format("{:g}{}", bytes_per_second / factor, name);
  return time + "," + rate;
}

}  // namespace dtensor
