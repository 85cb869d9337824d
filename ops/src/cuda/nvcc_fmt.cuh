#pragma once
// Include first in every .cu of ops/src/cuda/. fmt 9 turns its constexpr off
// under nvcc (FMT_USE_CONSTEXPR) but keeps FMT_CONSTEXPR20 on in C++20,
// so its headers fail to compile there ("call to non-constexpr function").
// nvcc 12+ handles fmt's constexpr code, so turn it back on; the functions
// are the same tokens either way. Better moved to the project's CUDA
// arguments (-DFMT_USE_CONSTEXPR=1) in meson.build.
#ifndef FMT_USE_CONSTEXPR
#define FMT_USE_CONSTEXPR 1
#endif
