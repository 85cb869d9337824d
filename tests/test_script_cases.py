#!/usr/bin/env python3
"""tests/script_cases.py, the reporting every test script uses, and
tools/count_tests.py reading what it prints: test_script_cases.py COUNT_TESTS

Each behaviour runs a small script that uses the helper in a child process
and checks its exit code and `case:` lines, read with count_tests' own
pattern: a failed check exits 1; a NaN, a count or None is not a pass;
every case skipped exits 77, some skipped and some passed 0, none at all 1;
a skip must say why; names come out one line, unique, and read back as
printed even when they hold ": passed"; a reason is one line of bounded
length with the whole detail below it; run() fails on an exception; the
unittest adapter gives one case per test method (a failing subtest, an
error, setUpClass, an unexpected success fail it; skipTest skips it with
its reason); and count_tests adds the lines up, naming each failure, and
fails a script that exits non-zero after its checks passed. Standard
library only.
"""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from script_cases import Cases  # noqa: E402


def load_count_tests(path):
    spec = importlib.util.spec_from_file_location("count_tests", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def child(body):
    """(exit code, stdout, stderr) of a script that imports the helper and runs BODY."""
    code = "import sys\nsys.path.insert(0, %r)\nfrom script_cases import *\n" % HERE + textwrap.dedent(body)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def main() -> int:
    count_tests = load_count_tests(sys.argv[1])
    cases = Cases()

    def parsed(out):
        """{name: (result, why)} as count_tests reads a script's stdout."""
        return count_tests.script_cases({"stdout": out})

    # Every check passes: exit 0, each line read back.
    rc, out, err = child("""
        c = Cases()
        c.check("first", True)
        c.check("second", 2 + 2 == 4, "arithmetic")
        sys.exit(c.finish())
    """)
    cases.check("checks that all pass exit 0, each a passed case",
                rc == 0 and parsed(out) == {"first": ("passed", ""), "second": ("passed", "")}, f"rc {rc}: {out}{err}")

    # One failed check among passes: exit 1, named with its reason.
    rc, out, err = child("""
        c = Cases()
        c.check("good", True)
        c.check("bad", False, "rc 3: the tool said no")
        c.check("after", True)
        sys.exit(c.finish())
    """)
    got = parsed(out)
    cases.check("a failed check makes the exit code 1, and the checks after it still run",
                rc == 1 and got.get("bad") == ("failed", "rc 3: the tool said no") and
                got.get("after") == ("passed", "") and len(got) == 3, f"rc {rc}: {out}{err}")

    # Values that are not True or False fail: a NaN is truthy in Python.
    rc, out, err = child("""
        c = Cases()
        c.check("nan", float("nan"))
        c.check("count", 1)
        c.check("text", "yes")
        c.check("none", None)
        c.check("nan compared", float("nan") <= 1e-9)
        sys.exit(c.finish())
    """)
    got = parsed(out)
    cases.check("a NaN, a count, a string or None is never a pass, and a NaN comparison fails",
                rc == 1 and sorted(got) == ["count", "nan", "nan compared", "none", "text"] and
                all(r == "failed" for r, _ in got.values()) and "nan" in got["nan"][1], f"rc {rc}: {out}{err}")

    rc, out, err = child("""
        c = Cases()
        c.skip("needs a GPU", "no GPU on this machine")
        c.skip("needs MPI", "this build has no MPI")
        sys.exit(c.finish())
    """)
    got = parsed(out)
    cases.check("every case skipped exits 77, each skip with its reason",
                rc == 77 and got == {"needs a GPU": ("skipped", "no GPU on this machine"),
                                     "needs MPI": ("skipped", "this build has no MPI")}, f"rc {rc}: {out}{err}")

    rc, out, err = child("""
        c = Cases()
        c.skip("needs a GPU", "no GPU on this machine")
        c.check("runs anywhere", True)
        sys.exit(c.finish())
    """)
    cases.check("some skipped and some passed exits 0", rc == 0 and len(parsed(out)) == 2, f"rc {rc}: {out}{err}")

    rc, out, err = child("""
        c = Cases()
        sys.exit(c.finish())
    """)
    got = parsed(out)
    cases.check("a script that reports no check exits 1 with a failed case",
                rc == 1 and len(got) == 1 and list(got.values())[0][0] == "failed", f"rc {rc}: {out}{err}")

    rc, out, err = child("""
        c = Cases()
        c.check("something", True)
        c.skip("no reason", "")
        sys.exit(c.finish())
    """)
    cases.check("a skip that does not say why is an error, not a skip",
                rc != 0 and "must say why" in err and "skipped" not in out, f"rc {rc}: {out}{err}")

    # Names: one line, unique, and read back as printed.
    rc, out, err = child("""
        c = Cases()
        c.check("two\\nlines", True)
        c.check("same", True)
        c.check("same", True)
        c.check("mode: passed", False, "it did not")
        c.check("x: failed: y", True)
        c.check("", True)
        sys.exit(c.finish())
    """)
    got = parsed(out)
    lines = [l for l in out.splitlines() if l.startswith("case: ")]
    cases.check("names come out one line and unique", "two / lines" in got and "same" in got and "same (2)" in got,
                out)
    cases.check("a name holding ': passed' or ': failed' reads back with its own result",
                len(lines) == 6 and len(got) == 6 and
                [r for r, _ in got.values()].count("failed") == 1 and
                any(r == "failed" and "mode" in n for n, (r, _) in got.items()) and
                any(r == "passed" and n.startswith("x") and "y" in n for n, (r, _) in got.items()), out)
    cases.check("an empty name is named", "(unnamed check)" in got, out)

    # Reasons: one line, bounded; the whole detail below for the log.
    rc, out, err = child("""
        c = Cases()
        c.check("multi", False, "rc 1:\\n  first line\\n\\n  last line: the error")
        c.check("long", False, "x" * 10000 + " the end")
        sys.exit(c.finish())
    """)
    got = parsed(out)
    multi, long_ = got.get("multi", ("", "")), got.get("long", ("", ""))
    cases.check("a multi-line reason is one line holding its first and last lines",
                multi[1] == "rc 1: / first line / last line: the error", multi)
    cases.check("a long reason is cut to at most 300 characters, keeping its end",
                len(long_[1]) <= 300 and long_[1].endswith("the end"), len(long_[1]))
    cases.check("the whole detail is printed below the failed line, indented, not read as cases",
                "    last line: the error" in out and len(got) == 2, out)

    rc, out, err = child("""
        c = Cases()
        c.run("returns", lambda: None)
        def broken():
            assert 1 == 2, "the boxes overlap"
        c.run("raises", broken)
        c.run("returns false", lambda: False)
        sys.exit(c.finish())
    """)
    got = parsed(out)
    cases.check("run() passes a function that returns, fails one that raises, naming the error",
                rc == 1 and got.get("returns") == ("passed", "") and got.get("raises", ("",))[0] == "failed" and
                "the boxes overlap" in got["raises"][1] and got.get("returns false", ("",))[0] == "failed",
                f"rc {rc}: {out}{err}")

    # The unittest adapter.
    rc, out, err = child("""
        import unittest

        class A(unittest.TestCase):
            def test_passes(self):
                self.assertEqual(1, 1)

            def test_fails(self):
                self.assertEqual(1, 2, "one is not two")

            def test_errors(self):
                raise RuntimeError("the tool crashed")

            def test_skips(self):
                self.skipTest("sanitizer runtimes reserve more address space than the cap")

            def test_subtests(self):
                for k in range(3):
                    with self.subTest(k=k):
                        self.assertNotEqual(k, 1)

            @unittest.expectedFailure
            def test_unexpected_success(self):
                pass

        class Broken(unittest.TestCase):
            @classmethod
            def setUpClass(cls):
                raise RuntimeError("no fixture")

            def test_never_runs(self):
                pass

        c = Cases()
        run_unittest(c)
        sys.exit(c.finish())
    """)
    got = parsed(out)
    cases.check("unittest: one case per test method, named Class.method",
                {"A.test_passes", "A.test_fails", "A.test_errors", "A.test_skips", "A.test_subtests",
                 "A.test_unexpected_success"} <= set(got), sorted(got))
    cases.check("unittest: a passing method passes", got.get("A.test_passes") == ("passed", ""), got)
    cases.check("unittest: a failing assertion fails with its message",
                got.get("A.test_fails", ("",))[0] == "failed" and "one is not two" in got["A.test_fails"][1], got)
    cases.check("unittest: an error fails with its message",
                got.get("A.test_errors", ("",))[0] == "failed" and "the tool crashed" in got["A.test_errors"][1], got)
    cases.check("unittest: skipTest is a skip with its reason, not a pass",
                got.get("A.test_skips") == ("skipped", "sanitizer runtimes reserve more address space than the cap"),
                got)
    cases.check("unittest: a failing subtest fails its method, naming the subtest",
                got.get("A.test_subtests", ("",))[0] == "failed" and "k=1" in got["A.test_subtests"][1], got)
    cases.check("unittest: an expected failure that passes fails",
                got.get("A.test_unexpected_success", ("",))[0] == "failed", got)
    cases.check("unittest: a failing setUpClass is a failed case",
                any(r == "failed" and "setUpClass" in n and "Broken" in n for n, (r, _) in got.items()), got)
    cases.check("unittest: the script exits 1", rc == 1, f"rc {rc}")

    # count_tests adds up what the helper prints, as a meson test log holds it.
    rc, passing_out, _ = child("""
        c = Cases()
        c.check("good", True)
        c.skip("needs MPI", "this build has no MPI")
        sys.exit(c.finish())
    """)
    rc2, failing_out, _ = child("""
        c = Cases()
        c.check("good", True)
        c.check("bad", False, "rc 3: the tool said no")
        sys.exit(c.finish())
    """)
    with tempfile.TemporaryDirectory() as build:
        os.makedirs(os.path.join(build, "meson-logs"))
        os.makedirs(os.path.join(build, "tests", "reports"))
        entries = [{"name": "one", "result": "OK", "stdout": passing_out, "stderr": ""},
                   {"name": "two", "result": "FAIL", "stdout": failing_out, "stderr": ""},
                   # Its checks passed, then it crashed.
                   {"name": "three", "result": "FAIL", "stdout": "case: fine: passed\n", "stderr": "Traceback"}]
        with open(os.path.join(build, "meson-logs", "testlog.json"), "w") as f:
            f.write("".join(json.dumps(e) + "\n" for e in entries))
        p = subprocess.run([sys.executable, sys.argv[1], build], capture_output=True, text=True, timeout=60)
    cases.check("count_tests counts each line: 3 passed, 2 failed, 1 skipped",
                p.returncode == 1 and p.stdout.strip().endswith("3 passed, 2 failed, 1 skipped"), p.stdout + p.stderr)
    cases.check("count_tests names the failed check with its reason",
                "failed: two/bad: rc 3: the tool said no" in p.stdout, p.stdout)
    cases.check("count_tests names the skip with its reason",
                "skipped: one/needs MPI (this build has no MPI)" in p.stdout, p.stdout)
    cases.check("count_tests fails a script that exits non-zero after its checks passed",
                "failed: three (FAIL after its checks)" in p.stdout, p.stdout)
    cases.check("count_tests sums the skips by reason", "skips: 1 x this build has no MPI" in p.stdout, p.stdout)

    # Boost logs a skipped unit by its path below the master suite.
    reasons = count_tests.skip_reasons({"stdout": '\x1b[0;39;49mx.cpp(79): Test case "group_stats/one_dim" is '
                                                  'skipped because precondition failed: needs a world of 4 ranks\n'})
    cases.check("a skipped case inside a suite gets the reason Boost logged for its path",
                count_tests.skip_reason(reasons, "dtensor/group_stats/one_dim") == "needs a world of 4 ranks",
                reasons)
    return cases.finish()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: test_script_cases.py PATH_TO_COUNT_TESTS")
    sys.exit(main())
