#pragma once
// Alpha-beta cost model with link parameters per mesh dimension.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <fmt/format.h>

namespace dtensor {

/// One mesh dimension's links: latency per hop and bandwidth per rank.
struct LinkParams {
  double hop_latency_s = 0.6e-6;  // PyTorch's intra-host figure
  double bandwidth_Bps = 87.7e9;  // bytes per second into one rank
  bool operator==(const LinkParams&) const = default;
};

/// Inter-host links as in PyTorch's model: 0.22x the bandwidth, 2.7 us/hop.
LinkParams inter_node_link();

struct CostModel {
  /// Per mesh dim; dims without an entry use `default_link`.
  std::vector<LinkParams> links;
  LinkParams default_link{};
  /// Fixed cost of issuing any collective.
  double base_latency_s = 6.6e-6;
  /// Bandwidth of local copies (slicing, packing), bytes per second.
  double local_copy_Bps = 20e9;

  const LinkParams& link(int mesh_dim) const;
  /// The slowest link among these dims (lowest bandwidth, highest latency).
  LinkParams group_link(std::span<const int> mesh_dims) const;
  /// Time of a collective: base + hops * latency + bytes_into_busiest_rank / bandwidth.
  double collective_seconds(std::span<const int> mesh_dims, std::int64_t hops, std::int64_t busiest_recv_bytes) const;

  bool operator==(const CostModel&) const = default;
  std::size_t hash() const;
};

}  // namespace dtensor

/// "87.7 GB/s, 0.6 us/hop".
template <>
struct fmt::formatter<dtensor::LinkParams> {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
  auto format(const dtensor::LinkParams& l, fmt::format_context& ctx) const {
    return fmt::format_to(ctx.out(), "{:.3g} GB/s, {:.3g} us/hop", l.bandwidth_Bps / 1e9, l.hop_latency_s * 1e6);
  }
};
/// "cost model: mesh dim 0 [19.3 GB/s, 2.7 us/hop]; other dims [87.7 GB/s, 0.6 us/hop]; 6.6 us per collective".
template <>
struct fmt::formatter<dtensor::CostModel> {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
  auto format(const dtensor::CostModel& c, fmt::format_context& ctx) const {
    auto out = fmt::format_to(ctx.out(), "cost model: ");
    for (std::size_t d = 0; d < c.links.size(); ++d) out = fmt::format_to(out, "mesh dim {} [{}]; ", d, c.links[d]);
    return fmt::format_to(out, "{} dims [{}]; {:.3g} us per collective", c.links.empty() ? "all" : "other",
                          c.default_link, c.base_latency_s * 1e6);
  }
};
