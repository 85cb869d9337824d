"""One line per check of a test script, in the form tools/count_tests.py counts.

Every test script under tests/ reports through this module (standard library
only), so that each of its checks is a case of the `meson test` count, not
the script as a whole:

    case: NAME: passed
    case: NAME: failed: one-line reason
    case: NAME: skipped: why

    from script_cases import Cases

    cases = Cases()
    cases.check("demo --ranks 8 succeeds", rc == 0, stderr)   # True or False, nothing else
    cases.skip("mpirun -np 8 demo succeeds", "this build has no MPI")
    cases.run("the boxes tile the tensor", reassemble, ckpt)  # an exception fails it
    sys.exit(cases.finish())

A check passes only when its value is the bool True: a NaN, a non-empty
string or a count is not a pass, and fails naming what it was. Names are
made one line, and unique within the script (" (2)", " (3)" appended). A
failure's reason is cut to one line on the case line; its whole detail
(the last lines) follows, indented, for the log. `finish()` gives the exit
code: 1 if any check failed (or none was reported at all), 77 (meson's
skip) if every one was skipped, 0 otherwise.

For unittest scripts, `run_unittest(cases)` runs the test cases of the
calling module and reports one case per test method: a failure or an error
(in the method, a subtest, setUp or setUpClass) fails it, `skipTest(why)`
skips it with that reason, and an expected failure that passed fails it.
"""
import re
import sys
import traceback
import unittest

REASON_CHARS = 300   # the most a case line's reason holds
DETAIL_LINES = 20    # the most lines of a failure's detail printed below it
# A result word after ": " in a name would end the name for count_tests.
RESULT_WORD = re.compile(r":(\s+)(passed|failed|skipped)(?=: |$)")


def one_line(text, limit=REASON_CHARS) -> str:
    """TEXT on one line: its non-empty lines joined by " / ", runs of white
    space made one space, and, if longer than LIMIT characters, its start and
    end with " ... " between (an error's last line is often the telling one)."""
    lines = [" ".join(line.split()) for line in str(text).splitlines()]
    flat = " / ".join(line for line in lines if line)
    if len(flat) <= limit:
        return flat
    half = (limit - 5) // 2
    return flat[:half] + " ... " + flat[len(flat) - half:]


class Cases:
    """The checks of one script, each printed as it is made."""

    def __init__(self, out=None):
        self.out = out if out is not None else sys.stdout
        self.names = set()
        self.passed = self.failed = self.skipped = 0

    def _name(self, name) -> str:
        """NAME made one line, safe for count_tests' pattern, and unique."""
        base = RESULT_WORD.sub(r" -\1\2", one_line(name, limit=200)) or "(unnamed check)"
        unique, n = base, 1
        while unique in self.names:
            n += 1
            unique = f"{base} ({n})"
        self.names.add(unique)
        return unique

    def _print(self, line: str, detail="") -> None:
        print(line, file=self.out)
        lines = [l.rstrip() for l in str(detail).strip("\n").splitlines()] if detail else []
        for l in lines[-DETAIL_LINES:]:
            print("    " + l, file=self.out)
        self.out.flush()

    def check(self, name, ok, detail="") -> bool:
        """One check: passed if OK is True, else failed, saying DETAIL (any
        object; printed with str). Returns whether it passed."""
        name = self._name(name)
        if ok is True:
            self.passed += 1
            self._print(f"case: {name}: passed")
            return True
        self.failed += 1
        if ok is not False:
            detail = f"the check's value is {ok!r}, not True or False" + (f"; {detail}" if detail != "" else "")
        reason = one_line(detail) or "the check was false"
        # The whole detail below the line where the line had to cut it.
        self._print(f"case: {name}: failed: {reason}", detail if reason != str(detail).strip() else "")
        return False

    def fail(self, name, detail) -> bool:
        """A check that failed, saying why."""
        return self.check(name, False, detail)

    def skip(self, name, why) -> None:
        """A check that cannot run here, saying why (a missing tool, a build
        without the feature): counted as skipped, not passed."""
        why = one_line(why)
        if not why:
            raise ValueError(f"skip({name!r}): a skip must say why")
        self.skipped += 1
        self._print(f"case: {self._name(name)}: skipped: {why}")

    def run(self, name, fn, *args, **kwargs) -> bool:
        """A check that passes if FN(*ARGS) returns without raising (and
        returns None or True); an exception fails it with its message."""
        try:
            value = fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - any error is the check failing
            return self.check(name, False, "".join(traceback.format_exception_only(type(e), e)).strip())
        return self.check(name, True if value is None else value)

    def exit_code(self) -> int:
        """1 if a check failed or none was reported, 77 if all were skipped, else 0."""
        if self.failed:
            return 1
        if not self.passed:
            return 77 if self.skipped else 1
        return 0

    def finish(self) -> int:
        """The exit code, after a failed case where the script reported no
        check at all (a script that checks nothing must not pass)."""
        if not (self.passed or self.failed or self.skipped):
            self.fail("(the script's checks)", "the script reported no check")
        counts = f"{self.passed} passed, {self.failed} failed, {self.skipped} skipped"
        print(counts, file=sys.stderr)
        return self.exit_code()


def _describe(err) -> str:
    """An exception info's last line (the assertion's message), and its traceback."""
    kind, value, tb = err
    last = "".join(traceback.format_exception_only(kind, value)).strip()
    return last, "".join(traceback.format_exception(kind, value, tb))


class CaseResult(unittest.TestResult):
    """A unittest result that reports each test method as one case."""

    def __init__(self, cases: Cases):
        super().__init__()
        self.cases = cases
        self.current = None  # {"failures": [(one line, detail)], "skip": why or None}

    @staticmethod
    def case_name(test) -> str:
        """Class.method, without the module (the script is the test's name)."""
        parts = test.id().split(".")
        return ".".join(parts[-2:]) if len(parts) >= 2 else test.id()

    def startTest(self, test):
        super().startTest(test)
        self.current = {"failures": [], "skip": None}

    def _record(self, test, line, detail):
        if self.current is None:  # setUpClass, a module fixture: no test started
            self.cases.fail(str(test), line + "\n" + detail)
        else:
            self.current["failures"].append((line, detail))

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, *_describe(err))

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, *_describe(err))

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            line, detail = _describe(err)
            where = getattr(subtest, "_subDescription", lambda: str(subtest))()
            self._record(test, f"{where}: {line}", detail)

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        if self.current is None:
            self.cases.skip(str(test), reason or "skipped without a reason")
        else:
            self.current["skip"] = reason or "skipped without a reason"

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "it passed, but is marked as an expected failure", "")

    def stopTest(self, test):
        super().stopTest(test)
        name = self.case_name(test)
        failures, skip = self.current["failures"], self.current["skip"]
        self.current = None
        if failures:
            reason = "; ".join(line for line, _ in failures)
            if len(failures) > 1:
                reason = f"{len(failures)} failures: {reason}"
            self.cases.check(name, False, reason + "\n" + "\n".join(detail for _, detail in failures))
        elif skip is not None:
            self.cases.skip(name, skip)
        else:
            self.cases.check(name, True)


def run_unittest(cases: Cases, module=None) -> None:
    """Runs the unittest cases of MODULE (default: the __main__ script),
    reporting each test method through CASES."""
    module = module if module is not None else sys.modules["__main__"]
    suite = unittest.defaultTestLoader.loadTestsFromModule(module)
    result = CaseResult(cases)
    suite.run(result)
    # Module and class fixtures run through the suite: nothing left to report.
