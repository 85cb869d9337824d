#pragma once
// The old name of dtensor/api/embedding.h (embedding, pick, cross_entropy),
// kept so that existing includes compile.
#include "dtensor/api/embedding.h"  // IWYU pragma: export
