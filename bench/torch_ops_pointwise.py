"""PyTorch's side of bench/kernels' pointwise rows (bench/kernels_pointwise.cpp).

OPS maps a row name to a function(shape, dtype) that builds the inputs (as
the C++ row does: normal samples, uniform on [0, 1) for log) and returns a zero-argument callable
running the op once, output freshly allocated as in the library's call.
"""
import torch
import torch.nn.functional as F


def _unary(fn):
    def make(shape, dtype):
        x = torch.randn(shape, dtype=torch.float32).to(dtype)
        return lambda: fn(x)
    return make


def _positive(fn):
    def make(shape, dtype):
        x = torch.rand(shape, dtype=torch.float32).to(dtype)
        return lambda: fn(x)
    return make


def _binary(fn):
    def make(shape, dtype):
        a = torch.randn(shape, dtype=torch.float32).to(dtype)
        b = torch.randn(shape, dtype=torch.float32).to(dtype)
        return lambda: fn(a, b)
    return make


def _layer_norm(shape, dtype):
    x = torch.randn(shape, dtype=torch.float32).to(dtype)
    return lambda: F.layer_norm(x, (shape[-1],), eps=1e-5)


OPS = {
    "exp": _unary(torch.exp),
    "log": _positive(torch.log),
    "tanh": _unary(torch.tanh),
    "sigmoid": _unary(torch.sigmoid),
    "gelu": _unary(lambda x: F.gelu(x, approximate="none")),
    "silu": _unary(F.silu),
    "softmax(-1)": _unary(lambda x: torch.softmax(x, -1)),
    "layer_norm": _layer_norm,
    "add": _binary(torch.add),
    "mul": _binary(torch.mul),
    "relu": _unary(torch.relu),
}
