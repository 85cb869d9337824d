#pragma once
// Internal: each op family registers its ops here; OpRegistry::global()
// calls register_builtin_ops once. Adding a family means one line in
// registry.cpp and one file of its own.
#include <string>

#include "dtensor/ops/op.h"

namespace dtensor {

void register_builtin_ops(OpRegistry& registry);
void register_pointwise_ops(OpRegistry& registry);  // pointwise.cpp
void register_einsum_ops(OpRegistry& registry);     // einsum.cpp
void register_reduction_ops(OpRegistry& registry);  // reduction.cpp
void register_shape_ops(OpRegistry& registry);      // shape_ops.cpp
void register_embedding_ops(OpRegistry& registry);  // embedding.cpp
void register_backward_ops(OpRegistry& registry);   // backward_ops.cpp

/// An op of a family that gives per-mesh-dim options: its name, inputs,
/// doc line, meta and dim_strategy set; the caller binds its kernels and
/// adds it (registry.cpp).
OpDef dim_strategy_op(std::string name, int num_inputs, std::string doc, MetaFn meta, DimStrategyFn dim_strategy);

}  // namespace dtensor
