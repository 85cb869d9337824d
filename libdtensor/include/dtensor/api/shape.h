#pragma once
// Front-end functions of the shape ops (written with the family).
#include "dtensor/api/functional.h"
