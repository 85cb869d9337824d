#include "dtensor/core/error.h"
#include "dtensor/ops/op.h"

namespace dtensor {

std::vector<Strategy> expand_to_mesh(std::span<const DimStrategy> per_dim, const StrategyQuery& query) {
  const int mesh_nd = static_cast<int>(query.mesh_shape.size());
  const std::size_t nin = query.inputs.size();
  std::vector<Strategy> out;
  if (per_dim.empty()) return out;
  // Odometer over one option per mesh dim.
  std::vector<std::size_t> pick(static_cast<std::size_t>(mesh_nd), 0);
  std::vector<std::vector<Placement>> in(nin, std::vector<Placement>(static_cast<std::size_t>(mesh_nd)));
  std::vector<Placement> outp(static_cast<std::size_t>(mesh_nd));
  while (true) {
    for (int m = 0; m < mesh_nd; ++m) {
      const DimStrategy& s = per_dim[pick[m]];
      for (std::size_t i = 0; i < nin; ++i) in[i][m] = s.inputs.at(i);
      outp[m] = s.output;
    }
    Strategy cand;
    bool valid = true;
    try {
      for (std::size_t i = 0; i < nin && valid; ++i)
        cand.inputs.push_back(validate_layout(Layout(in[i]), query.mesh_shape, query.inputs[i].shape));
      if (valid) cand.output = validate_layout(Layout(outp), query.mesh_shape, query.output.shape);
    } catch (const LayoutError&) {
      valid = false;
    }
    if (valid) out.push_back(std::move(cand));
    int m = mesh_nd - 1;
    while (m >= 0 && ++pick[m] == per_dim.size()) pick[m--] = 0;
    if (m < 0) break;
  }
  return out;
}

}  // namespace dtensor
