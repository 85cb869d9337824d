#pragma once
// Front-end functions of the linalg ops (written with the family).
#include "dtensor/api/functional.h"
