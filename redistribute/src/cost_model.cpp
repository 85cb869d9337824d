#include "dtensor/redistribute/cost_model.h"

#include <algorithm>
#include <bit>
#include <functional>

#include "dtensor/core/hash.h"

namespace dtensor {

LinkParams inter_node_link() { return LinkParams{2.7e-6, 0.22 * LinkParams{}.bandwidth_Bps}; }

const LinkParams& CostModel::link(int mesh_dim) const {
  if (mesh_dim >= 0 && static_cast<std::size_t>(mesh_dim) < links.size()) return links[mesh_dim];
  return default_link;
}

LinkParams CostModel::group_link(std::span<const int> mesh_dims) const {
  if (mesh_dims.empty()) return default_link;
  LinkParams out = link(mesh_dims[0]);
  for (int m : mesh_dims.subspan(1)) {
    const LinkParams& l = link(m);
    out.hop_latency_s = std::max(out.hop_latency_s, l.hop_latency_s);
    out.bandwidth_Bps = std::min(out.bandwidth_Bps, l.bandwidth_Bps);
  }
  return out;
}

double CostModel::collective_seconds(std::span<const int> mesh_dims, std::int64_t hops,
                                     std::int64_t busiest_recv_bytes) const {
  LinkParams l = group_link(mesh_dims);
  return base_latency_s + static_cast<double>(hops) * l.hop_latency_s +
         static_cast<double>(busiest_recv_bytes) / l.bandwidth_Bps;
}

std::size_t CostModel::hash() const {
  std::size_t h = 0x51ed270b27f3a1c5ull;
  auto mix = [&](double v) { hash_combine(h, std::hash<double>{}(v)); };
  for (const LinkParams& l : links) {
    mix(l.hop_latency_s);
    mix(l.bandwidth_Bps);
  }
  mix(default_link.hop_latency_s);
  mix(default_link.bandwidth_Bps);
  mix(base_latency_s);
  mix(local_copy_Bps);
  mix(static_cast<double>(links.size()));
  return h;
}

}  // namespace dtensor
