#pragma once
// Front-end functions of the reduction ops (written with the family).
#include "dtensor/api/functional.h"
