#!/usr/bin/env python3
"""Tests of the dtensor-plan command line: run as `test_cli.py PATH_TO_BINARY`.

Standard library only. Prints one `case:` line per test method
(tests/script_cases.py); exits 1 if any failed.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_cases import Cases, run_unittest  # noqa: E402

BINARY = None
EXAMPLE = ["--mesh", "2x4", "--shape", "64,128", "--dtype", "f32", "--from", "S(0),S(1)", "--to", "R,R"]
PLAN_KEYS = ["mesh", "shape", "dtype", "from", "to", "steps", "recv_bytes", "est_seconds"]
RUN_KEYS = PLAN_KEYS + ["verified", "measured_recv_bytes"]
STEP_KEYS = ["op", "mesh_dims", "recv_bytes"]
STEP_OPS = {"all_gather", "all_reduce", "reduce_scatter", "all_to_all", "exchange", "slice", "zero_fill", "relabel"}


def run(*args, timeout=60):
    return subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=timeout)


def run_json(testcase, *args):
    proc = run(*args, "--json")
    testcase.assertEqual(proc.returncode, 0, f"{args}: stderr: {proc.stderr}")
    lines = proc.stdout.strip().splitlines()
    testcase.assertEqual(len(lines), 1, f"{args}: expected one JSON line, got {proc.stdout!r}")
    return json.loads(lines[0])


class JsonOutput(unittest.TestCase):
    def test_keys_are_exactly_the_documented_ones(self):
        out = run_json(self, *EXAMPLE)
        self.assertEqual(list(out.keys()), PLAN_KEYS)
        self.assertTrue(out["steps"])
        for step in out["steps"]:
            self.assertEqual(list(step.keys()), STEP_KEYS)
            self.assertIn(step["op"], STEP_OPS)
            self.assertIsInstance(step["mesh_dims"], list)
            self.assertIsInstance(step["recv_bytes"], int)

    def test_example_values(self):
        out = run_json(self, *EXAMPLE)
        self.assertEqual(out["mesh"], [2, 4])
        self.assertEqual(out["shape"], [64, 128])
        self.assertEqual(out["dtype"], "f32")
        self.assertEqual(out["from"], "S(0),S(1)")
        self.assertEqual(out["to"], "R,R")
        # Every rank lacks 7/8 of the tensor and must receive it.
        self.assertEqual(out["recv_bytes"], 7 * 64 * 128 * 4 // 8)
        self.assertGreater(out["est_seconds"], 0)
        self.assertLessEqual(max(s["recv_bytes"] for s in out["steps"]), out["recv_bytes"])

    def test_layouts_print_in_text_form(self):
        out = run_json(self, "--mesh", "2x2", "--shape", "16,8", "--from", "Shard(dim=0)[1], S(0)[0]", "--to",
                       "Replicate(),Partial(sum)")
        self.assertEqual(out["from"], "S(0)[1],S(0)[0]")
        self.assertEqual(out["to"], "R,P(sum)")
        out = run_json(self, "--mesh", "2", "--shape", "4,6", "--from", "S(-1)", "--to", "R", "--dtype", "float64")
        self.assertEqual(out["from"], "S(1)")
        self.assertEqual(out["dtype"], "f64")

    def test_same_layout_needs_nothing(self):
        out = run_json(self, "--mesh", "2x4", "--shape", "64,128", "--from", "S(0),R", "--to", "S(0),R")
        self.assertEqual(out["steps"], [])
        self.assertEqual(out["recv_bytes"], 0)

    def test_slow_dims_make_the_estimate_slower(self):
        fast = run_json(self, *EXAMPLE)
        slow = run_json(self, *EXAMPLE, "--slow-dims", "0")
        slower = run_json(self, *EXAMPLE, "--slow-dims", "0,1")
        self.assertGreater(slow["est_seconds"], fast["est_seconds"])
        self.assertGreaterEqual(slower["est_seconds"], slow["est_seconds"])

    def test_ranks_that_match_are_accepted(self):
        self.assertEqual(run_json(self, *EXAMPLE, "--ranks", "8")["mesh"], [2, 4])


# (mesh, shape, from, to, dtype): plans that --run must verify, with the
# bytes measured on the threads backend equal to the planned ones.
RUN_CASES = [
    ("2x4", "64,128", "S(0),S(1)", "R,R", "f32"),
    ("2x3", "13,7", "S(0),S(1)", "S(1),R", "f32"),
    ("2x3", "13,7", "S(1),S(0)", "S(0),S(1)", "f64"),
    ("3", "13,7", "S(0)", "S(1)", "i64"),
    ("2x3", "13,7", "P(sum),S(0)", "R,R", "f32"),
    ("2x3", "13,7", "P(sum),P(sum)", "S(1),S(0)", "f64"),
    ("2x4", "64,128", "P(sum),S(1)", "S(0),R", "f32"),
    ("2x2", "9,5", "P(sum),R", "S(0),S(1)", "i64"),
    ("4", "10", "P(avg)", "S(0)", "f32"),
    ("2x2", "10,3", "P(avg),P(avg)", "R,S(0)", "i64"),
    ("2x2", "9,5", "P(max),S(1)", "R,R", "f32"),
    ("2x2", "9,5", "S(0),P(min)", "S(1),R", "i64"),
    ("2x2", "8,8", "R,R", "P(sum),S(0)", "f32"),
    ("2x2", "8,8", "S(0),S(1)", "P(max),R", "f64"),
    ("2x2x2", "8,6,4", "S(0),S(2),P(max)", "R,S(1),S(0)", "i64"),
    ("2x2x2", "5,3,7", "S(2),S(0),S(1)", "R,S(2),S(2)", "f32"),
    ("2x2", "16,8", "S(0)[1],S(0)[0]", "S(0),S(0)", "f32"),
    ("2x2", "16,8", "S(0),S(0)", "S(0)[1],S(0)[0]", "i64"),
    ("2x3", "13,7", "S(0)[1],S(0)[0]", "R,S(1)", "f32"),
    ("2x3", "0,7", "S(0),S(1)", "R,S(0)", "f32"),
    ("2x3", "3,0", "P(sum),S(1)", "R,R", "f32"),
    ("3", "0", "S(0)", "R", "i64"),
    ("2", "", "P(sum)", "R", "f32"),
    ("2x2x2x2", "5", "S(0),S(0),S(0),S(0)", "R,R,R,R", "f32"),
    ("2x2x2x2", "3,4,5,2", "S(0),S(1),S(2),S(3)", "S(3),S(2),S(1),S(0)", "f64"),
]


class Run(unittest.TestCase):
    def check_run(self, mesh, shape, src, dst, dtype, *extra):
        args = ["--mesh", mesh, "--shape", shape, "--from", src, "--to", dst, "--dtype", dtype, "--run", *extra]
        out = run_json(self, *args)
        self.assertEqual(list(out.keys()), RUN_KEYS)
        self.assertIs(out["verified"], True, args)
        self.assertEqual(out["measured_recv_bytes"], out["recv_bytes"], args)

    def test_cases(self):
        for case in RUN_CASES:
            with self.subTest(case=case):
                self.check_run(*case)

    def test_example_measures_seven_eighths(self):
        out = run_json(self, *EXAMPLE, "--run")
        self.assertIs(out["verified"], True)
        self.assertEqual(out["measured_recv_bytes"], 7 * 64 * 128 * 4 // 8)

    def test_seeds_and_slow_links(self):
        for seed in ["0", "1", "12345678901234"]:
            with self.subTest(seed=seed):
                self.check_run("2x3", "13,7", "P(sum),S(1)", "S(1),R", "f32", "--seed", seed, "--slow-dims", "0")

    def test_human_mode_reports_the_run(self):
        proc = run(*EXAMPLE, "--run")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("verified: yes", proc.stdout)
        self.assertIn("measured: the busiest rank received 28 KiB (28672 B); planned 28 KiB (28672 B)", proc.stdout)


class HumanOutput(unittest.TestCase):
    def test_example(self):
        proc = run(*EXAMPLE)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stderr, "")
        out = proc.stdout
        for text in ["64x128 f32", "2x4 mesh of 8 ranks", "Before: S(0),S(1)", "After: R,R", "step 1: ", "why: ",
                     "KiB", " us", "mesh dim 1 (4 ranks): S(1) splits tensor dim 1 (size 128) into 4 chunks",
                     "every rank holds a 32x32 (4 KiB) shard", "held by: 0 = {0,1,2,3,4,5,6,7}"]:
            self.assertIn(text, out)
        grid = [line for line in out.splitlines() if line.strip().startswith(("+", "|")) or "+--" in line]
        self.assertTrue(grid)
        self.assertTrue(all(len(line) <= 80 for line in grid), grid)
        # The source grid: rank 0..3 across the first row of blocks, 4..7 below.
        labels = [line.split("|")[1:-1] for line in grid if "|" in line]
        rows = [[c.strip() for c in cells] for cells in labels if any(c.strip() for c in cells)]
        self.assertIn(["0", "1", "2", "3"], rows)
        self.assertIn(["4", "5", "6", "7"], rows)

    def test_uneven_shards_and_partial(self):
        out = run("--mesh", "2x3", "--shape", "13,7", "--from", "P(sum),S(1)", "--to", "S(0),R").stdout
        self.assertIn("P(sum): values are partial over mesh dim 0", out)
        self.assertIn("shards range from", out)
        self.assertIn("held by: 0 = {0,3}", out)

    def test_3d_prints_a_table(self):
        out = run("--mesh", "2x4", "--shape", "64,8,128", "--from", "S(0),S(2)", "--to", "R,R").stdout
        self.assertIn("rank 3 (0,3): [0:32, 0:8, 96:128]", out)

    def test_empty_shards_are_named(self):
        out = run("--mesh", "4", "--shape", "2", "--from", "S(0)", "--to", "R").stdout
        self.assertIn("ranks {2,3} hold an empty shard", out)

    def test_zero_size_tensor(self):
        proc = run("--mesh", "2x3", "--shape", "0,7", "--from", "S(0),S(1)", "--to", "R,S(0)")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("no elements", proc.stdout)


# (arguments, text the one line on stderr must name)
BAD_ARGUMENTS = [
    (["--from", "S(0),Q"], "'Q' is not a placement"),
    (["--from", "S(0),S(2)"], "Shard(2)"),
    (["--to", "R,S(-3)"], "Shard(-3)"),
    (["--to", "R"], "--to 'R'"),
    (["--from", "S(0)[1],S(0)"], "--from 'S(0)[1],S(0)'"),
    (["--from", "P(sum),P(max)"], "P(max)"),
    (["--mesh", "2x0"], "--mesh '2x0'"),
    (["--mesh", "2xx4"], "--mesh '2xx4'"),
    (["--mesh", "two"], "--mesh 'two'"),
    (["--mesh", "2x1x1x2x2"], "--mesh '2x1x1x2x2'"),
    (["--ranks", "6"], "--ranks 6"),
    (["--shape", "64"], "--shape 64"),
    (["--shape", "64,x"], "--shape '64,x'"),
    (["--shape", "64,-2"], "-2"),
    (["--dtype", "f16"], "--dtype 'f16'"),
    (["--dtype", "complex"], "--dtype 'complex'"),
    (["--slow-dims", "2"], "--slow-dims '2'"),
    (["--seed", "abc"], "--seed"),
    (["--bogus"], "--bogus"),
]


class Pictures(unittest.TestCase):
    SVG_NS = "{http://www.w3.org/2000/svg}"

    def draw(self, *args):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "plan.svg")
            proc = run(*args, "--svg", path)
            self.assertEqual(proc.returncode, 0, f"{args}: stderr: {proc.stderr}")
            return ET.parse(path).getroot()

    def groups(self, root, cls):
        return [g for g in root.iter(self.SVG_NS + "g") if g.get("class") == cls]

    def test_one_panel_per_step_and_one_before(self):
        out = run_json(self, *EXAMPLE)
        root = self.draw(*EXAMPLE)
        self.assertEqual(len(self.groups(root, "plan-panel")), len(out["steps"]) + 1)
        self.assertEqual(len(self.groups(root, "step")), len(out["steps"]))
        texts = [t.text or "" for t in root.iter(self.SVG_NS + "text")]
        self.assertTrue(any(t.startswith("step 1: " + out["steps"][0]["op"]) for t in texts), texts)

    def test_partial_source_is_hatched_and_named_dims_are_used(self):
        root = self.draw("--mesh", "2x2", "--dims", "dp,tp", "--shape", "8,6", "--from", "S(0),P(sum)", "--to",
                         "R,S(1)")
        first = self.groups(root, "plan-panel")[0]
        hatched = [r for r in first.iter(self.SVG_NS + "rect") if r.get("class") == "partial"]
        self.assertEqual(len(hatched), 2)  # two row blocks, each a pending sum over tp
        texts = [t.text or "" for t in root.iter(self.SVG_NS + "text")]
        self.assertTrue(any("sum over tp" in t for t in texts), texts)

    def test_html_page_is_self_contained(self):
        out = run_json(self, *EXAMPLE)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "plan.html")
            proc = run(*EXAMPLE, "--html", path)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            with open(path, encoding="utf-8") as f:
                page = f.read()
        self.assertTrue(page.startswith("<!DOCTYPE html>"))
        # Nothing is fetched: no src or href attributes, no stylesheet links.
        self.assertNotRegex(page, r"\b(src|href)\s*=")
        self.assertNotIn("<link", page)
        self.assertIn("<svg", page)
        self.assertIn("mouseenter", page)  # the hover
        self.assertEqual(page.count("<li>"), len(out["steps"]))

    def test_dims_that_do_not_fit_the_mesh_exit_2(self):
        proc = run(*EXAMPLE, "--dims", "dp", "--svg", os.devnull)
        self.assertEqual(proc.returncode, 2)
        self.assertIn("--dims 'dp' names 1 mesh dims, but --mesh '2x4' has 2", proc.stderr)

    def test_unwritable_file_exits_2(self):
        proc = run(*EXAMPLE, "--svg", "/nonexistent-dir/plan.svg")
        self.assertEqual(proc.returncode, 2)
        self.assertIn("/nonexistent-dir/plan.svg", proc.stderr)


class BadArguments(unittest.TestCase):
    def test_each_class_exits_2_with_one_line(self):
        base = dict(zip(EXAMPLE[0::2], EXAMPLE[1::2]))
        for override, named in BAD_ARGUMENTS:
            with self.subTest(args=override):
                opts = dict(base)
                extra = []
                if len(override) == 2 and override[0] in opts:
                    opts[override[0]] = override[1]
                else:
                    extra = override
                args = [x for kv in opts.items() for x in kv] + extra
                proc = run(*args)
                self.assertEqual(proc.returncode, 2, f"{args}: {proc.stdout} {proc.stderr}")
                self.assertEqual(proc.stdout, "")
                lines = proc.stderr.splitlines()
                self.assertEqual(len(lines), 1, proc.stderr)
                self.assertTrue(lines[0].startswith("dtensor-plan: "), lines[0])
                self.assertIn(named, lines[0])

    def test_integers_out_of_range_are_refused_not_clamped_or_wrapped(self):
        # The argument parser used to wrap --seed -1 to 2^64-1, clamp an
        # overflowing --seed or --ranks to the type's maximum, and read 0x10 as 16.
        seed_range = "expected a whole-number seed from 0 to 18446744073709551615"
        ranks_range = "expected a whole number of ranks from 1 to 1024"
        cases = [
            ("--seed", "-1", seed_range),
            ("--seed", "18446744073709551616", seed_range),
            ("--seed", "99999999999999999999999", seed_range),
            ("--seed", "0x10", seed_range),
            ("--seed", "+5", seed_range),
            ("--ranks", "18446744073709551620", ranks_range),
            ("--ranks", "9223372036854775808", ranks_range),
            ("--ranks", "-4", ranks_range),
            ("--ranks", "0", ranks_range),
            ("--ranks", "1025", ranks_range),
        ]
        for option, value, expected in cases:
            with self.subTest(option=option, value=value):
                proc = run(*EXAMPLE, "--run", option, value)
                self.assertEqual(proc.returncode, 2, f"{option} {value}: {proc.stdout} {proc.stderr}")
                self.assertEqual(proc.stdout, "")
                self.assertEqual(proc.stderr, f"dtensor-plan: {option} '{value}': {expected}\n")

    def test_integers_at_the_ends_of_their_range_are_accepted(self):
        out = run_json(self, *EXAMPLE, "--run", "--seed", "18446744073709551615", "--ranks", "8")
        self.assertIs(out["verified"], True)

    def test_the_documented_message(self):
        proc = run("--mesh", "2x4", "--shape", "64,128", "--from", "S(0),Q", "--to", "R,R")
        self.assertEqual(proc.stderr, "dtensor-plan: --from 'S(0),Q': 'Q' is not a placement: "
                                      "expected S(d), R or P(sum|avg|max|min)\n")

    def test_missing_option(self):
        proc = run("--mesh", "2x4", "--shape", "64,128", "--from", "S(0),S(1)")
        self.assertEqual(proc.returncode, 2)
        self.assertEqual(len(proc.stderr.splitlines()), 1)
        self.assertIn("--to", proc.stderr)

    def test_help_exits_0(self):
        proc = run("--help")
        self.assertEqual(proc.returncode, 0)
        for option in ["--mesh", "--shape", "--dtype", "--from", "--to", "--slow-dims", "--json", "--run", "--seed"]:
            self.assertIn(option, proc.stdout)


class BadSizes(unittest.TestCase):
    """Sizes beyond int64, beyond the planner's limits or --run's budget:
    exit 2 with one line naming the value, never a crash or a wrapped number."""

    def check_refused(self, args, *named, code=2):
        proc = run(*args)
        self.assertEqual(proc.returncode, code, f"{args}: {proc.stdout} {proc.stderr}")
        self.assertEqual(proc.stdout, "")
        lines = proc.stderr.splitlines()
        self.assertTrue(lines and lines[-1].startswith("dtensor-plan: "), proc.stderr)
        for n in named:
            self.assertIn(n, proc.stderr)

    def test_shape_whose_size_overflows(self):
        for extra in ([], ["--json"]):
            with self.subTest(extra=extra):
                self.check_refused(["--mesh", "2", "--shape", "9223372036854775807,2", "--from", "S(0)", "--to", "R",
                                    *extra], "9223372036854775807,2", "does not fit")
        # The count fits, the f32 bytes do not.
        self.check_refused(["--mesh", "2", "--shape", "4611686018427387904", "--from", "S(0)", "--to", "R",
                            "--json"], "4611686018427387904")

    def test_largest_tensor_has_positive_bytes_and_time(self):
        # 2^44 f32 elements: the planner's 64 TiB.
        out = run_json(self, "--mesh", "2x4", "--shape", "17592186044416", "--from", "S(0),R", "--to", "R,R")
        self.assertGreater(out["recv_bytes"], 0)
        self.assertGreater(out["est_seconds"], 0)
        for step in out["steps"]:
            self.assertGreaterEqual(step["recv_bytes"], 0)
        proc = run("--mesh", "2x4", "--shape", "1048576,16777216", "--from", "S(0),S(1)", "--to", "S(1),S(0)")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.check_refused(["--mesh", "2", "--shape", "17592186044417", "--from", "S(0)", "--to", "R"],
                           "17592186044417", "70368744177664")

    def test_mesh_whose_rank_count_overflows(self):
        for mesh in ["4x4611686018427387905", "2x9223372036854775807", "4294967296x4294967296x4"]:
            with self.subTest(mesh=mesh):
                self.check_refused(["--mesh", mesh, "--shape", "8", "--from", "R" + ",R" * mesh.count("x"),
                                    "--to", "R" + ",R" * mesh.count("x"), "--json"], mesh)

    def test_meshes_beyond_the_planner_limit(self):
        for mesh in ["32768", "16384", "65536", "128x64", "2048"]:
            with self.subTest(mesh=mesh):
                layout = "S(0)" + ",R" * mesh.count("x")
                self.check_refused(["--mesh", mesh, "--shape", "8", "--from", layout, "--to",
                                    "R" + ",R" * mesh.count("x")], mesh, "at most 1024")
        out = run_json(self, "--mesh", "1024", "--shape", "2048", "--from", "S(0)", "--to", "R")
        self.assertEqual(out["recv_bytes"], 1023 * 8)
        # Within the ranks but over the work budget: the most dims this mesh takes.
        self.check_refused(["--mesh", "2x2x2x2", "--shape", ",".join(["2"] * 16), "--from", "S(0),R,S(1),R", "--to",
                            "R,S(1),R,S(0)"], "16 dims", "at most 14 dims on this mesh")

    def test_tensor_beyond_the_dims_limit(self):
        shape = ",".join(["2"] + ["1"] * 999)
        self.check_refused(["--mesh", "2", "--shape", shape, "--from", "S(0)", "--to", "R"], "1000 dims",
                           "at most 16")

    def test_run_beyond_the_budget_is_refused_up_front(self):
        # 30000x30000 f64 is 6.7 GiB: refused before any thread starts.
        self.check_refused(["--mesh", "4", "--shape", "30000,30000", "--dtype", "f64", "--from", "S(0)", "--to",
                            "R", "--run"], "30000x30000", "1 GiB")
        # The same plan without --run is fine.
        out = run_json(self, "--mesh", "4", "--shape", "30000,30000", "--dtype", "f64", "--from", "S(0)",
                       "--to", "R")
        self.assertEqual(out["recv_bytes"], 3 * 7500 * 30000 * 8)

    def test_run_out_of_memory_is_said_as_such(self):
        # Within the budget, but the address space is capped below what the
        # run needs: out of memory, named with the size, exit 3 (not 1).
        ldd = subprocess.run(["ldd", BINARY], capture_output=True, text=True).stdout
        if "libasan" in ldd or "libtsan" in ldd:
            self.skipTest("sanitizer runtimes reserve more address space than the cap")
        import resource

        # The shared libraries are mapped whole (a CUDA build maps cuBLAS,
        # hundreds of MiB): the cap leaves room for them and 400 MiB more.
        libraries = 0
        for line in ldd.splitlines():
            path = line.split("=>")[-1].split("(")[0].strip()
            if path.startswith("/") and os.path.isfile(path):
                libraries += os.path.getsize(path)
        limit = (400 << 20) + libraries

        def cap():
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

        proc = subprocess.run([BINARY, "--mesh", "2", "--shape", "4096,8192", "--from", "S(0)", "--to", "R", "--run",
                               "--json"], capture_output=True, text=True, timeout=60, preexec_fn=cap)
        self.assertEqual(proc.returncode, 3, proc.stderr)
        self.assertIn("out of memory", proc.stderr)
        self.assertIn("4096x8192 f32 tensor (128 MiB)", proc.stderr)
        self.assertNotIn("std::bad_alloc", proc.stderr)

    def test_nesting_level_that_does_not_fit(self):
        self.check_refused(["--mesh", "2x2", "--shape", "8", "--from", "S(0)[4294967296],S(0)[1]", "--to", "R,R"],
                           "S(0)[4294967296],S(0)[1]")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_cli.py PATH_TO_DTENSOR_PLAN")
    BINARY = sys.argv.pop(1)
    cases = Cases()
    run_unittest(cases)
    sys.exit(cases.finish())
