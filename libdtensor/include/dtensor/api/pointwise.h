#pragma once
// Front-end functions of the pointwise ops (written with the family).
#include "dtensor/api/functional.h"
