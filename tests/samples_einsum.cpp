// Samples for the einsum ops: written with the family (tests/op_cases.h).
#include "op_cases.h"
