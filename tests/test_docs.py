#!/usr/bin/env python3
"""The README and the guides against the code. Standard library only.

    test_docs.py FIRST_PROGRAM SOURCE_ROOT
        1. Runs FIRST_PROGRAM (examples/first_program) and checks that its
           stdout is exactly the block README.md shows after
           `<!-- output: first_program -->` (a ```text fence, the form
           docs/tutorial.md uses). The program prints the planner's
           estimates, not measured times, so the whole output is compared,
           with no number left out.
        2. Checks that every relative link and image in README.md,
           CONTRIBUTING.md, bench/README.md and docs/*.md names a file or
           folder that exists, and that every #anchor names a heading of the
           target Markdown file (GitHub's slugs). Links inside code are not
           links; http(s) and mailto links are not checked. A link must sit
           on one line (one it cannot read is a failure, not a pass).
        Prints one `case:` line per check (tests/script_cases.py): the
        first program's output, and each document's links; exits 1 if any
        failed.

    test_docs.py --links-only SOURCE_ROOT
        Only the second check (no build needed).
"""
import difflib
import glob
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_cases import Cases  # noqa: E402

# `<!-- output: first_program -->` followed by a ```text fenced block.
OUTPUT_BLOCK = re.compile(r"<!-- output: (?P<name>[\w-]+) -->\n```text\n(?P<text>.*?)^```$", re.S | re.M)
FENCE = re.compile(r"^ {0,3}(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:.+?)\1")
# [text](target) and ![alt](target), the text allowed one level of brackets
# ("S(0)[1],S(0)[0]"), the target up to an optional "title".
LINK = re.compile(r"!?\[(?:[^\[\]\\]|\\.|\[[^\[\]]*\])*\]\(\s*<?(?P<target>[^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(?P<text>.*?)\s*#*\s*$")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...
TIMEOUT_SECONDS = 120
# launch() reads these; a value left in the environment would change the run.
LAUNCH_VARIABLES = ("DTENSOR_RANKS", "DTENSOR_BACKEND", "DTENSOR_DEVICE", "DTENSOR_TRACE", "DTENSOR_TIMEOUT_MS")


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def documents(root):
    """The Markdown files whose links are checked, relative to root."""
    names = ["README.md", "CONTRIBUTING.md", os.path.join("bench", "README.md")]
    names += sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "docs", "*.md")))
    return names


def prose_lines(text, keep_code=False):
    """(line number, line) outside fenced code blocks; inline code removed
    unless keep_code (a heading's anchor keeps it)."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if match:
            if fence is None:
                fence = match.group(1)
            elif line.strip().startswith(fence):
                fence = None
            continue
        if fence is None:
            yield number, line if keep_code else INLINE_CODE.sub("", line)


def slug(heading):
    """GitHub's anchor for a heading: its text as rendered, lowercased, with
    everything but letters, digits, '_', '-' and spaces removed, and spaces
    turned into '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link shows its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"(?<!\w)_+|_+(?!\w)", "", text)  # _emphasis_, not snake_case
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(text):
    """Every heading's anchor in a Markdown text, with GitHub's -1, -2 for repeats."""
    seen = {}
    result = set()
    for _, line in prose_lines(text, keep_code=True):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match["text"])
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def check_links(root, cases):
    """One case per document: its relative links and anchors resolve."""
    anchor_cache = {}

    def anchors_of(path):
        if path not in anchor_cache:
            anchor_cache[path] = anchors(read(path))
        return anchor_cache[path]

    for name in documents(root):
        doc = os.path.join(root, name)
        what = f"{name}: every relative link and anchor resolves"
        if not os.path.isfile(doc):
            cases.fail(what, f"{name}: missing")
            continue
        failures = []
        checked = 0
        for number, line in prose_lines(read(doc)):
            matches = list(LINK.finditer(line))
            if line.count("](") > len(matches):
                failures.append(f"{name}:{number}: a link this check cannot read (keep each link on one line)")
            for match in matches:
                target = match["target"]
                if not target or EXTERNAL.match(target):
                    continue
                checked += 1
                path, _, anchor = target.partition("#")
                where = f"{name}:{number}: {target}"
                resolved = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
                if not os.path.exists(resolved):
                    failures.append(f"{where}: no such file")
                    continue
                if anchor:
                    if not resolved.endswith(".md") or not os.path.isfile(resolved):
                        failures.append(f"{where}: an anchor into something that is not Markdown")
                    elif anchor not in anchors_of(resolved):
                        failures.append(f"{where}: no heading with the anchor #{anchor} in "
                                        f"{os.path.relpath(resolved, root)}")
        print(f"{name}: {checked} links checked")
        cases.check(what, not failures, f"{len(failures)} of {checked} links:\n" + "\n".join(failures))


def check_first_program(program, root, cases):
    what = "first_program prints exactly the output README.md shows"
    readme = os.path.join(root, "README.md")
    blocks = [m for m in OUTPUT_BLOCK.finditer(read(readme)) if m["name"] == "first_program"]
    if len(blocks) != 1:
        cases.fail(what, f"README.md: expected one `<!-- output: first_program -->` block, found {len(blocks)}")
        return
    # OpenBLAS picks its kernels by CPU, and launch() reads DTENSOR_*: run as a reader would.
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE" and k not in LAUNCH_VARIABLES}
    proc = subprocess.run([program], capture_output=True, text=True, timeout=TIMEOUT_SECONDS, env=env)
    if proc.returncode != 0:
        cases.fail(what, f"{program} exited with {proc.returncode}: {proc.stderr}")
        return
    documented = blocks[0]["text"]
    diff = difflib.unified_diff(documented.splitlines(keepends=True), proc.stdout.splitlines(keepends=True),
                                "README.md (first_program)", "first_program's stdout")
    cases.check(what, proc.stdout == documented, f"output differs from README.md:\n{''.join(diff)}")


def main(argv):
    cases = Cases()
    if len(argv) == 2 and argv[0] == "--links-only":
        check_links(argv[1], cases)
    elif len(argv) == 2 and not argv[0].startswith("-"):
        program, root = argv
        check_first_program(program, root, cases)
        check_links(root, cases)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return cases.finish()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
