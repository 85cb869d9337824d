"""The shape rows of bench/kernels (bench/kernels_shape.cpp) in PyTorch.

OPS maps each row name that bench/kernels prints to a function
(shape, dtype) -> zero-argument callable doing the same op on CPU tensors made
once up front; bench/kernels_torch.py times the callables. `shape` and `dtype`
are the row's own ("shape": [4096, 1024], "dtype": "f32").

PyTorch's transpose, permute, narrow and slicing only make views; dtensor's
make a new row-major tensor. So that both sides move the same bytes, each of
those is followed by .contiguous() (which copies). cat and the GEMMs make new
tensors on both sides and need nothing added.
"""

import torch

DTYPES = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16, "f16": torch.float16,
          "i64": torch.int64}


# dtype: the row's name ("f32") or, as kernels_torch.py passes it, a torch dtype.
def _rand(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, generator=g, dtype=torch.float32).to(DTYPES.get(dtype, dtype))


def _transpose01(shape, dtype):
    x = _rand(shape, dtype, 1)
    return lambda: x.transpose(0, 1).contiguous()  # a view without .contiguous()


def _transpose01_into(shape, dtype):
    # The "[kernel]" row: the copy alone into an output made once (no allocation).
    x = _rand(shape, dtype, 9)
    out = torch.empty(shape[1], shape[0], dtype=DTYPES.get(dtype, dtype))
    return lambda: out.copy_(x.transpose(0, 1))


def _permute0213(shape, dtype):
    x = _rand(shape, dtype, 2)
    return lambda: x.permute(0, 2, 1, 3).contiguous()  # a view without .contiguous()


def _narrow_half(shape, dtype):
    x = _rand(shape, dtype, 3)
    return lambda: x.narrow(1, 0, shape[1] // 2).contiguous()  # a view without .contiguous()


def _inner_box(shape, dtype):
    # The box of the C++ row: offset (1024, 256), size (2048, 512) of 4096x1024.
    x = _rand(shape, dtype, 3)
    r0, c0, rows, cols = shape[0] // 4, shape[1] // 4, shape[0] // 2, shape[1] // 2
    return lambda: x[r0:r0 + rows, c0:c0 + cols].contiguous()  # a view without .contiguous()


def _cat_dim1(shape, dtype):
    # `shape` is each input's (4096x512); the output is 4096x1024.
    a, b = _rand(shape, dtype, 4), _rand(shape, dtype, 5)
    return lambda: torch.cat([a, b], dim=1)


def _linear(shape, dtype):
    # `shape` is W's (4096x1024); x is 64 x W's columns.
    w = _rand(shape, dtype, 8)
    x = _rand([64, shape[1]], dtype, 7)
    return lambda: torch.nn.functional.linear(x, w)


def _matmul_transposed(shape, dtype):
    # PyTorch passes the transposed view of W to its GEMM as a transpose flag;
    # dtensor's transpose makes a copy first.
    w = _rand(shape, dtype, 8)
    x = _rand([64, shape[1]], dtype, 7)
    return lambda: torch.matmul(x, w.transpose(0, 1))


OPS = {
    "transpose(0,1)": _transpose01,
    "transpose(0,1) [kernel]": _transpose01_into,
    "permute(0,2,1,3)": _permute0213,
    "narrow(1,0,512)": _narrow_half,
    "slice_box(inner half)": _inner_box,
    "cat(dim=1) of 2": _cat_dim1,
    "linear(x,W) [gemm]": _linear,
    "matmul(x,transpose(W))": _matmul_transposed,
}
