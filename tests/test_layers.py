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

Standard library only. Prints one `case:` line per check
(tests/script_cases.py): per layer, its own and lower headers preprocess,
each layer it must not see is refused, and its sources use no ruled-out
include spelling. Exits 1 if any failed.
"""
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_cases import Cases  # noqa: E402

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
    return None


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


def spelling_violations(layer):
    found = []
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
    cases = Cases()
    with tempfile.TemporaryDirectory(prefix="dtensor-layers-") as scratch:
        for layer, below in BELOW.items():
            command = layer_command(commands, layer)
            own = f"{layer}: its own and lower headers preprocess with its compile command"
            refused = [other for other in BELOW if other != layer and other not in below]
            if command is None:
                for name in [own] + [f"{layer}: including {HEADER[other]} fails ({other} is not below it)"
                                     for other in refused]:
                    cases.fail(name, f"no compile command for a source under {layer}/src/ in compile_commands.json")
                continue
            directory, argv, source = command
            allowed = [HEADER[l] for l in below + [layer]]
            ok, err = preprocess(directory, argv, source, allowed, scratch)
            cases.check(own, ok, err)
            for other in refused:
                ok, err = preprocess(directory, argv, source, [HEADER[other]], scratch)
                name = f"{layer}: including {HEADER[other]} fails ({other} is not below it)"
                if ok:
                    cases.fail(name, f"{layer} can include {HEADER[other]}: the build does not enforce the layers")
                else:
                    cases.check(name, f"{HEADER[other]}: No such file" in err,
                                f"it failed, but not for want of the header:\n{err}")
    for layer in BELOW:
        spellings = spelling_violations(layer)
        cases.check(f"{layer}: no include by path from the source root or by '..'", not spellings,
                    "\n".join(spellings))
    return cases.finish()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    SOURCE_ROOT = os.path.abspath(sys.argv[1])
    BUILD_DIR = os.path.abspath(sys.argv[2])
    sys.exit(main())
