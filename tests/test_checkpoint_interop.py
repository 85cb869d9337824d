#!/usr/bin/env python3
"""Checkpoints against the reference safetensors implementation (PyPI).

A safetensors file written by Python is sharded into a checkpoint on a 2x2
mesh by `dtensor-ckpt convert`; Python's `safetensors` reads every rank file,
and the tensors reassembled from the manifest's boxes equal what it wrote;
the consolidated file (`convert --to-single`) reads back equal too. `info`
and `verify` exit 0 on it; a flipped byte makes `verify` exit 1 naming the
file, tensor and box; a bad command line exits 2.

Usage: test_checkpoint_interop.py DTENSOR_CKPT. Prints one `case:` line per
check (tests/script_cases.py); where safetensors or numpy cannot be imported,
the checks that need them are skips saying so and the command-line checks
still run (on a small file written here). Exits 1 if any failed.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_cases import Cases  # noqa: E402

try:
    import numpy as np
    from safetensors.numpy import load_file, save_file
    MISSING = None
except ImportError as e:
    MISSING = f"{e} (./dev test installs safetensors and numpy with pip)"

# The tensors Python writes, by name (the checks are named after them).
TENSORS = ["wte", "bias", "steps", "half", "empty"]
# The checks that need safetensors and numpy, the last five after the first.
CONVERT = "convert a Python safetensors file to a 2x2 checkpoint"
READ_BACK = "{}: rank files read by safetensors equal what Python wrote"
SINGLE = "the consolidated file reads back equal"
INFO = "info exits 0 and draws the boxes"
VERIFY = "verify exits 0"
FLIPPED = "a flipped byte: verify exits 1 naming the file, tensor and box"
AFTER_CONVERT = [READ_BACK.format(name) for name in TENSORS] + [SINGLE, INFO, VERIFY, FLIPPED]


def run(tool, *args):
    p = subprocess.run([tool, *args], capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


def reassemble(ckpt, name, entry):
    """The global tensor `name` rebuilt from its boxes, each read by safetensors."""
    dtype = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "F16": np.float16}[entry["dtype"]]
    out = np.zeros(entry["shape"], dtype=dtype)
    seen = np.zeros(entry["shape"], dtype=np.int64)
    files = {}
    for box in entry["boxes"]:
        tensors = files.setdefault(box["file"], load_file(os.path.join(ckpt, box["file"])))
        key = f"{name}@{','.join(str(o) for o in box['offset'])}"
        piece = tensors[key]
        assert list(piece.shape) == box["size"], (key, piece.shape, box["size"])
        where = tuple(slice(o, o + s) for o, s in zip(box["offset"], box["size"]))
        out[where] = piece
        seen[where] += 1
    assert (seen == 1).all(), f"{name}: the boxes do not cover each element once"
    return out


def write_small_file(path):
    """A safetensors file of one 10x6 f32 tensor "wte" of zeros, written
    without numpy: 8 bytes of header length, the JSON header, the data."""
    header = json.dumps({"wte": {"dtype": "F32", "shape": [10, 6], "data_offsets": [0, 240]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + bytes(240))


def command_line_checks(cases, tool, source, tmp, ckpt):
    """The checks that need no Python reader: bad command lines."""
    rc, out, err = run(tool, "convert", source, "--mesh", "2x2", "--layout", "wte", "--out", ckpt + "2")
    cases.check("a bad --layout exits 2 naming it", rc == 2 and "--layout 'wte'" in err, err)
    rc, out, err = run(tool, "verify", os.path.join(tmp, "nowhere"))
    cases.check("verify of a directory without a manifest exits 1", rc == 1 and "manifest.json" in err, err)


def main():
    tool = sys.argv[1]
    cases = Cases()
    if MISSING:
        for name in [CONVERT] + AFTER_CONVERT:
            cases.skip(name, MISSING)
        with tempfile.TemporaryDirectory() as tmp:
            source = os.path.join(tmp, "small.safetensors")
            write_small_file(source)
            command_line_checks(cases, tool, source, tmp, os.path.join(tmp, "ckpt"))
        return cases.finish()
    rng = np.random.default_rng(20261202)
    original = {
        "wte": rng.standard_normal((10, 6)).astype(np.float32),
        "bias": rng.standard_normal(7),
        "steps": np.arange(5, dtype=np.int64),
        "half": rng.standard_normal((3, 4, 5)).astype(np.float16),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }
    assert list(original) == TENSORS
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "python.safetensors")
        save_file(original, source)
        ckpt = os.path.join(tmp, "ckpt")
        rc, out, err = run(tool, "convert", source, "--mesh", "2x2", "--dims", "dp,tp", "--layout", "wte=S(0),S(1)",
                           "--layout", "bias=R,S(0)", "--layout", "half=S(2),S(0)", "--out", ckpt)
        cases.check(CONVERT, rc == 0, err)
        if rc == 0:
            manifest = json.load(open(os.path.join(ckpt, "manifest.json")))
            for name, want in original.items():
                try:
                    got = reassemble(ckpt, name, manifest["tensors"][name])
                    ok, detail = got.dtype == want.dtype and np.array_equal(got, want), name
                except Exception as e:  # noqa: BLE001 - a box that does not read back fails the check
                    ok, detail = False, f"{name}: {type(e).__name__}: {e}"
                cases.check(READ_BACK.format(name), ok, detail)
            single = os.path.join(tmp, "single.safetensors")
            rc, out, err = run(tool, "convert", ckpt, "--to-single", single)
            back = load_file(single) if rc == 0 else {}
            cases.check(SINGLE, rc == 0 and set(back) == set(original) and
                        all(np.array_equal(back[k], v) and back[k].dtype == v.dtype for k, v in original.items()), err)
            rc, out, err = run(tool, "info", ckpt)
            cases.check(INFO, rc == 0 and "S(0),S(1)" in out and "+---" in out, out + err)
            rc, out, err = run(tool, "verify", ckpt)
            cases.check(VERIFY, rc == 0 and out.startswith("ok:"), out + err)
            box = manifest["tensors"]["wte"]["boxes"][0]
            path = os.path.join(ckpt, box["file"])
            with open(path, "r+b") as f:
                f.seek(box["byte_range"][0] + 3)
                byte = f.read(1)
                f.seek(box["byte_range"][0] + 3)
                f.write(bytes([byte[0] ^ 0x40]))
            rc, out, err = run(tool, "verify", ckpt)
            cases.check(FLIPPED, rc == 1 and box["file"] in err and "tensor wte box" in err and "checksum" in err, err)
        else:
            for name in AFTER_CONVERT:
                cases.fail(name, "not run: the conversion failed")
        command_line_checks(cases, tool, source, tmp, ckpt)
    return cases.finish()


if __name__ == "__main__":
    sys.exit(main())
