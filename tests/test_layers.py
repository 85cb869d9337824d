#!/usr/bin/env python3
"""The layers are enforced by the build, not by a README line.

    test_layers.py SOURCE_ROOT BUILD_DIR

Each layer builds as its own library that sees only its own headers and the
public headers of the layers below it (meson.build says how). This test takes
the compile command the build really uses for one source of each layer (from
BUILD_DIR/compile_commands.json) and preprocesses with it:
  - a file that includes a public header of every layer at or below it, which
    must succeed (so the command itself works, and the layers below are seen);
  - for every layer it must not see (those above it, and its siblings), a
    file that includes one of that layer's public headers, which must fail
    for want of the header: the deliberate violation the build refuses.
It also reads every library source for the include spellings the layers rule
out: no `#include "../..."` and no path from the source root (such as
"libdtensor/..." or "mesh/src/...").

Standard library only. Prints each violation; exits non-zero if any.
"""
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

# Bottom to top; each layer with the layers it may use (transitively closed).
BELOW = {
    "core": [],
    "mesh": ["core"],
    "redistribute": ["core", "mesh"],
    "ops": ["core", "mesh", "redistribute"],
    "libdtensor": ["core", "mesh", "redistribute", "ops"],
    "nn": ["core", "mesh", "redistribute", "ops", "libdtensor"],
    "checkpoint": ["core", "mesh", "redistribute", "ops", "libdtensor"],
    "pictures": ["core", "mesh", "redistribute", "ops", "libdtensor"],
    "train": ["core", "mesh", "redistribute", "ops", "libdtensor", "nn", "checkpoint", "pictures"],
}
# One public header per layer, as a user or an upper layer spells it.
HEADER = {
    "core": "dtensor/core/tensor.h",
    "mesh": "dtensor/mesh/device_mesh.h",
    "redistribute": "dtensor/redistribute/planner.h",
    "ops": "dtensor/ops/dispatch.h",
    "libdtensor": "dtensor/api/dtensor_tensor.h",
    "nn": "dtensor/nn/modules.h",
    "checkpoint": "dtensor/checkpoint/checkpoint.h",
    "pictures": "dtensor/pictures/svg.h",
    "train": "dtensor/train/trainer.h",
}
# A quoted include that names a path from the source root.
ROOT_PATH = re.compile(r'^\s*#\s*include\s+"(?:\.\./|(?:' + "|".join(BELOW) + r'|examples|tests|bench|tools)/)', re.M)


def layer_command(commands, layer):
    """The build's compile command for one C++ source of `layer`, as argv."""
    prefix = layer + "/src/"
    for entry in commands:
        source = os.path.relpath(os.path.join(entry["directory"], entry["file"]), SOURCE_ROOT)
        if source.startswith(prefix) and source.endswith(".cpp"):
            argv = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
            return entry["directory"], argv, entry["file"]
    raise SystemExit(f"[test_layers] no compile command for a source under {prefix} in compile_commands.json")


def preprocess(directory, argv, source, includes, scratch):
    """Runs the layer's command with -E on a file of `includes`; (ok, stderr)."""
    test_file = os.path.join(scratch, "probe.cpp")
    with open(test_file, "w") as f:
        f.write("".join(f'#include "{h}"\n' for h in includes))
    out = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in ("-o", "-MF", "-MQ", "-MT"):
            skip = True
            continue
        if arg in ("-c", "-MD", "-MMD") or arg == source:
            continue
        out.append(arg)
    out += ["-E", "-o", os.devnull, test_file]
    proc = subprocess.run(out, cwd=directory, capture_output=True, text=True)
    return proc.returncode == 0, proc.stderr


def spelling_violations():
    found = []
    for layer in BELOW:
        for folder, _, files in os.walk(os.path.join(SOURCE_ROOT, layer)):
            for name in files:
                if not name.endswith((".h", ".cpp", ".cu", ".cuh")):
                    continue
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    for match in ROOT_PATH.finditer(f.read()):
                        found.append(f"{os.path.relpath(path, SOURCE_ROOT)}: {match.group(0).strip()}")
    return found


def main():
    with open(os.path.join(BUILD_DIR, "compile_commands.json")) as f:
        commands = json.load(f)
    failures = []
    checks = 0
    with tempfile.TemporaryDirectory(prefix="dtensor-layers-") as scratch:
        for layer, below in BELOW.items():
            directory, argv, source = layer_command(commands, layer)
            allowed = [HEADER[l] for l in below + [layer]]
            ok, err = preprocess(directory, argv, source, allowed, scratch)
            checks += 1
            if not ok:
                failures.append(f"{layer}: its own and lower headers do not preprocess with its command:\n{err}")
            for other in BELOW:
                if other == layer or other in below:
                    continue
                ok, err = preprocess(directory, argv, source, [HEADER[other]], scratch)
                checks += 1
                if ok:
                    failures.append(f"{layer} can include {HEADER[other]} ({other} is not below it): "
                                    "the build does not enforce the layers")
                elif f"{HEADER[other]}: No such file" not in err:
                    failures.append(f"{layer} including {HEADER[other]} failed, but not for want of it:\n{err}")
    spellings = spelling_violations()
    failures += [f"an include by path from the source root or by '..': {s}" for s in spellings]
    for f in failures:
        print(f"FAILED: {f}")
    print(f"{checks} layer checks, {len(spellings)} include spellings ruled out, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    SOURCE_ROOT = os.path.abspath(sys.argv[1])
    BUILD_DIR = os.path.abspath(sys.argv[2])
    sys.exit(main())
