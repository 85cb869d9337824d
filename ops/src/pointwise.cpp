// Placeholder until the family lands.
#include "families.h"

namespace dtensor {
void register_pointwise_ops(OpRegistry&) {}
}  // namespace dtensor
