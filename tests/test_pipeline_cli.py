#!/usr/bin/env python3
"""Tests of the dtensor-pipeline command line: run as `test_pipeline_cli.py PATH_TO_BINARY`.

Standard library only; a handful of runs of the binary (each takes
milliseconds). Prints one `case:` line per test method
(tests/script_cases.py); exits 1 if any failed.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_cases import Cases, run_unittest  # noqa: E402

BINARY = None
JSON_KEYS = ["schedule", "stages", "microbatches", "actions", "makespan", "bubble_fraction", "peak_microbatches"]
# Two ranks whose communication both starts with a send (pytorch#172668).
BOTH_SEND_FIRST = ("0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
                   "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n")


def run(*args):
    return subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=60)


def check_file(text):
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
        f.write(text)
    try:
        return run("--check", f.name)
    finally:
        os.unlink(f.name)


class Pipeline(unittest.TestCase):
    def test_text_shows_the_grid_makespan_bubble_and_peaks(self):
        proc = run("--schedule", "1f1b", "--stages", "4", "--microbatches", "8")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("rank 3", proc.stdout)
        self.assertIn("makespan 33 ", proc.stdout)  # 3(m+p-1)
        self.assertIn("bubble fraction 0.2727", proc.stdout)  # (p-1)/(m+p-1) = 3/11
        self.assertIn("peak microbatches held per rank: 4 3 2 1", proc.stdout)

    def test_ranks_sharing_cores(self):
        # One core: the whole work, 3pm at unit costs; two: between the plain makespan and half the work.
        one = run("--schedule", "1f1b", "--stages", "4", "--microbatches", "8", "--cores", "1", "--json")
        self.assertEqual(one.returncode, 0, one.stderr)
        self.assertAlmostEqual(json.loads(one.stdout)["makespan"], 3 * 4 * 8)
        two = run("--schedule", "1f1b", "--stages", "4", "--microbatches", "8", "--cores", "2")
        self.assertEqual(two.returncode, 0, two.stderr)
        self.assertIn("the ranks sharing 2 cores", two.stdout)
        makespan = float(two.stdout.split("makespan ")[1].split()[0])
        self.assertTrue(48 <= makespan and 33 <= makespan, two.stdout)

    def test_json_has_exactly_the_documented_keys(self):
        proc = run("--schedule", "interleaved", "--stages", "2", "--microbatches", "4", "--virtual", "2", "--json")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        out = json.loads(proc.stdout)
        self.assertEqual(list(out), JSON_KEYS)
        self.assertEqual(out["makespan"], 3 * 2 * 4 + 3 * 1)  # 3vm + 3(p-1)
        self.assertEqual(sorted(out["actions"]), ["0", "1"])
        self.assertEqual(len(out["actions"]["0"]), 2 * 2 * 4)  # v*m forwards and backwards
        self.assertEqual(out["actions"]["0"][0], "0F0")

    def test_svg_draws_each_rank_and_action(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "zb.svg")
            proc = run("--schedule", "zb-h1", "--stages", "2", "--microbatches", "2", "--svg", path)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            with open(path) as f:
                svg = f.read()
        self.assertEqual(svg.count('class="box"'), 2 * 2 * 3)  # F, I and W per microbatch and rank
        for rank in range(2):
            self.assertIn(f">rank {rank}</text>", svg)
        for kind in ("forward", "input_backward", "weight_backward"):
            self.assertIn(f'data-kind="{kind}"', svg)
        self.assertIn(">1I0</text>", svg)

    def test_a_schedule_that_cannot_be_made_exits_2_naming_the_rule(self):
        proc = run("--schedule", "1f1b", "--stages", "8", "--microbatches", "1")
        self.assertEqual(proc.returncode, 2)
        self.assertIn("1f1b needs m >= p", proc.stderr)

    def test_help_lists_every_schedule_and_dualpipev_runs_by_name(self):
        proc = run("--help")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        for name in ("gpipe", "1f1b", "interleaved", "zb-h1", "zbv", "dualpipev"):
            self.assertIn(name, proc.stdout)
        proc = run("--schedule", "dualpipev", "--stages", "4", "--microbatches", "8", "--virtual", "2", "--json")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        out = json.loads(proc.stdout)
        self.assertEqual(out["stages"], 8)  # 2 per rank, in a V
        self.assertEqual(out["peak_microbatches"], [9] * 4)  # 2p + 1 stage activations on every rank
        proc = run("--schedule", "dualpipev", "--stages", "4", "--microbatches", "7")
        self.assertEqual(proc.returncode, 2)
        self.assertIn("dualpipev needs m >= 2p", proc.stderr)

    def test_check_accepts_a_valid_csv_and_refuses_a_deadlock(self):
        proc = check_file("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        proc = check_file(BOTH_SEND_FIRST)
        self.assertEqual(proc.returncode, 2)
        self.assertIn("deadlock with blocking sends", proc.stderr)
        self.assertIn("[0SEND_F1]", proc.stderr)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_pipeline_cli.py PATH_TO_DTENSOR_PIPELINE")
    BINARY = sys.argv.pop(1)
    cases = Cases()
    run_unittest(cases)
    sys.exit(cases.finish())
