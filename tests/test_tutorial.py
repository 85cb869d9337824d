#!/usr/bin/env python3
"""The tutorial (docs/tutorial.md) against its programs. Standard library only.

    test_tutorial.py DOC PICTURES_DIR PROGRAM...
        Runs each program (examples/tutorial/) and checks that its stdout is
        exactly the block the document shows after `<!-- output: NAME -->`,
        that every program has such a block and every block a program, and
        that the programs the document runs with `--pictures` draw exactly
        the SVG files committed in PICTURES_DIR. Prints one `case:` line
        per check (tests/script_cases.py), a diff below a mismatch; exits 1
        if anything differs.

        What a program measures changes from run to run, so it is marked
        and left out of the comparison, and nothing else is: a number
        printed just before "(measured" (step 9's "47.0% (measured; 27.3%
        simulated)"), on both sides, and the bytes of a picture drawn from
        measured times, named *_measured.svg (that it is drawn and committed
        is still checked).

    test_tutorial.py --write DOC PICTURES_DIR PROGRAM...
        Regenerates the pictures into PICTURES_DIR (meson's `docs` target).
        A *_measured.svg already there is kept (delete it to draw it again),
        so that redrawing the others does not change it.
"""
import difflib
import filecmp
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_cases import Cases  # noqa: E402

# `<!-- output: tutorial_01_mesh -->` followed by a ```text fenced block.
OUTPUT_BLOCK = re.compile(r"<!-- output: (?P<name>[\w-]+) -->\n```text\n(?P<text>.*?)^```$", re.S | re.M)
# A command line of the document that asks a program for its pictures.
DRAWS = re.compile(r"(?P<name>tutorial_\w+) --pictures ")
# An image the document shows, relative to the document.
IMAGE = re.compile(r"!\[[^\]]*\]\((?P<path>pictures/tutorial/[^)]+\.svg)\)")
# A measured value: the number just before "(measured", a percentage's or a
# time's ("47.0% (measured", "3.1 ms (measured").
MEASURED = re.compile(r"\d+(?:\.\d+)?(?=(?:%| ?[mun]?s)? \(measured\b)")
MEASURED_PICTURE = "_measured.svg"
TIMEOUT_SECONDS = 120


def documented_outputs(doc_text):
    outputs = {}
    for match in OUTPUT_BLOCK.finditer(doc_text):
        name = match["name"]
        if name in outputs:
            raise SystemExit(f"[test_tutorial] two output blocks for {name}")
        outputs[name] = match["text"]
    return outputs


def run(program, *args):
    # OpenBLAS picks its kernels by CPU: a forced core type is not what a student has.
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    proc = subprocess.run([program, *args], capture_output=True, text=True, timeout=TIMEOUT_SECONDS, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{program} {' '.join(args)} exited with {proc.returncode}: {proc.stderr}")
    return proc.stdout


def without_measured(text):
    """The text with each measured number replaced by one placeholder."""
    return MEASURED.sub("<measured>", text)


def compare_pictures(name, drawn_dir, committed_dir):
    """Failures, one line each, where a program's pictures differ from the
    committed ones (a measured picture only where it is not committed)."""
    failures = []
    for picture in sorted(os.listdir(drawn_dir)):
        committed = os.path.join(committed_dir, picture)
        if not os.path.exists(committed):
            failures.append(f"{name}: draws {picture}, which is not in {committed_dir} (run `ninja docs`)")
        elif picture.endswith(MEASURED_PICTURE):
            continue
        elif not filecmp.cmp(os.path.join(drawn_dir, picture), committed, shallow=False):
            failures.append(f"{name}: {picture} differs from the committed one (run `ninja docs`)")
    return failures


def check(doc_path, pictures_dir, programs):
    with open(doc_path, encoding="utf-8") as f:
        doc_text = f.read()
    cases = Cases()
    outputs = documented_outputs(doc_text)
    drawing = set(m["name"] for m in DRAWS.finditer(doc_text))
    by_name = {os.path.basename(p): p for p in programs}
    unbuilt = sorted(set(outputs) - set(by_name))
    cases.check("every output block of the document has a program", not unbuilt,
                f"documented but not built: {unbuilt}")
    undocumented = sorted(set(by_name) - set(outputs))
    cases.check("every program has an output block in the document", not undocumented,
                f"built but their output is not in {doc_path}: {undocumented}")
    all_drawn = set()
    for name in sorted(set(by_name) & set(outputs)):
        with tempfile.TemporaryDirectory() as drawn:
            args = ["--pictures", drawn] if name in drawing else []
            try:
                got = run(by_name[name], *args)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                cases.fail(f"{name} prints exactly the document's output", e)
                if name in drawing:
                    cases.fail(f"{name} draws exactly the committed pictures", f"not run: {name} failed")
                continue
            all_drawn |= set(os.listdir(drawn))
            expected, printed = without_measured(outputs[name]), without_measured(got)
            diff = difflib.unified_diff(expected.splitlines(keepends=True), printed.splitlines(keepends=True),
                                        f"{doc_path} ({name})", f"{name}'s stdout")
            cases.check(f"{name} prints exactly the document's output", printed == expected,
                        f"output differs from the document:\n{''.join(diff)}")
            if name in drawing:
                failures = compare_pictures(name, drawn, pictures_dir)
                cases.check(f"{name} draws exactly the committed pictures", not failures, "\n".join(failures))
    # Every picture committed is drawn by some program (none left over from an
    # old version), and every picture the document shows is committed.
    committed = set(p for p in os.listdir(pictures_dir) if p.endswith(".svg")) if os.path.isdir(pictures_dir) else set()
    left_over = sorted(committed - all_drawn)
    cases.check("every committed picture is drawn by a program", not left_over,
                f"in {pictures_dir} but no program draws them: {left_over}")
    shown = set(os.path.basename(m["path"]) for m in IMAGE.finditer(doc_text))
    missing = sorted(shown - committed)
    cases.check("every picture the document shows is committed", not missing,
                f"shown by {doc_path} but not in {pictures_dir}: {missing}")
    return cases.finish()


def write_pictures(doc_path, pictures_dir, programs):
    with open(doc_path, encoding="utf-8") as f:
        drawing = set(m["name"] for m in DRAWS.finditer(f.read()))
    os.makedirs(pictures_dir, exist_ok=True)
    for program in programs:
        name = os.path.basename(program)
        if name not in drawing:
            continue
        with tempfile.TemporaryDirectory() as drawn:
            run(program, "--pictures", drawn)
            for picture in sorted(os.listdir(drawn)):
                target = os.path.join(pictures_dir, picture)
                if picture.endswith(MEASURED_PICTURE) and os.path.exists(target):
                    print(f"{name}: kept the committed {picture} (measured; delete it to draw it again)")
                    continue
                shutil.copyfile(os.path.join(drawn, picture), target)
        print(f"{name}: pictures written to {pictures_dir}")
    return 0


def main(argv):
    write = argv[:1] == ["--write"]
    args = argv[1:] if write else argv
    if len(args) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    doc_path, pictures_dir, programs = args[0], args[1], args[2:]
    return (write_pictures if write else check)(doc_path, pictures_dir, programs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
