#!/usr/bin/env python3
"""bench/kernels next to PyTorch: the same ops on the same tensors, one thread.

Usage: python3 bench/kernels_torch.py [build/bench/kernels] [--rounds=N] [--reps=N]

Runs the C++ benchmark with --json and times each of its rows in PyTorch
(torch.set_num_threads(1)), alternating: each round runs the C++ binary once
and then every PyTorch op, so that both see the same machine load. Prints the
best time of each over the rounds, the ratio torch/library (> 1: the library
is faster) and that ratio's spread over the rounds. The PyTorch side of each
row comes from the OPS dicts of bench/torch_ops_pointwise.py and
bench/torch_ops_shape.py (row name -> function(shape, dtype) returning a
zero-argument callable); a row with no entry is listed as such. Without torch
the script says so and exits 0.
"""
import importlib
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def load_ops():
    ops = {}
    for module in ("torch_ops_pointwise", "torch_ops_shape"):
        try:
            ops.update(importlib.import_module(module).OPS)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
            print(f"({module}.py not present: its rows have no PyTorch time)")
    return ops


def best_seconds(fn, reps):
    fn()  # warm up
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    opts = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    binary = args[0] if args else os.path.join("build", "bench", "kernels")
    rounds = int(opts.get("rounds", 3))
    reps = int(opts.get("reps", 20))
    try:
        import torch
    except ImportError:
        print("torch is not installed: nothing to compare (pip install torch)")
        return 0
    torch.set_num_threads(1)
    dtypes = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16, "f16": torch.float16,
              "i64": torch.int64}
    ops = load_ops()

    lib = {}    # row key -> best library seconds
    tor = {}    # row key -> best torch seconds
    ratios = {}  # row key -> per-round torch/library ratios
    order = []
    callables = {}
    for r in range(rounds):
        out = subprocess.run([binary, "--json", f"--reps={reps}"], check=True, capture_output=True, text=True).stdout
        rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        for row in rows:
            key = (row["group"], row["name"], tuple(row["shape"]), row["dtype"])
            if r == 0:
                order.append(key)
            lib[key] = min(lib.get(key, float("inf")), row["seconds"])
            if row["name"] not in ops:
                continue
            if key not in callables:
                callables[key] = ops[row["name"]](list(row["shape"]), dtypes[row["dtype"]])
            t = best_seconds(callables[key], reps)
            tor[key] = min(tor.get(key, float("inf")), t)
            ratios.setdefault(key, []).append(t / row["seconds"])

    print(f"bench/kernels vs PyTorch {torch.__version__}, one thread, best of {reps} x {rounds} alternating rounds")
    print(f"{'group':<10} {'op':<24} {'shape':<14} {'dtype':>5} {'library us':>11} {'torch us':>9} "
          f"{'torch/lib':>9}  spread")
    for key in order:
        group, name, shape, dtype = key
        shape_s = "x".join(str(s) for s in shape)
        if key not in tor:
            print(f"{group:<10} {name:<24} {shape_s:<14} {dtype:>5} {lib[key] * 1e6:>11.1f} {'-':>9} {'-':>9}  "
                  "(no PyTorch entry)")
            continue
        rs = ratios[key]
        print(f"{group:<10} {name:<24} {shape_s:<14} {dtype:>5} {lib[key] * 1e6:>11.1f} {tor[key] * 1e6:>9.1f} "
              f"{tor[key] / lib[key]:>9.2f}  {min(rs):.2f}-{max(rs):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
