#!/usr/bin/env python3
"""Adds up the test cases of the last `meson test` run of one or more meson
builds (`count_tests.py build build-cuda`; `--skipped WHAT` adds a named skip,
e.g. a build that could not be made on this machine).

Each Boost.Test suite writes an XML report (tests/meson.build passes
--report_sink); its leaf test cases are counted one by one. A meson test
without a report (a script, or a suite that crashed before writing one) counts
as one case, passed, failed or skipped as meson saw it. An MPI job writes one
report per rank (NAME.xml for rank 0, NAME.rank<r>.xml for the others): a case
counts once, failed if it failed on any rank. Prints the skipped and failed
cases by name, each failure followed by the error lines its suite logged for
it (a CI log cut to its tail must say why, not only what), then one line,
"N passed, N failed, N skipped", and exits 1 if anything failed.

A case that passed with no assertion (Boost's report says how many ran; an
MPI job's ranks are added up) counts as failed: it checked nothing. A script
that prints one line per check, `case: NAME: passed|failed|skipped[: why]`
(tests/script_cases.py writes them), counts each of those as a case. A case
skipped in several builds (the device cases of a CPU build and of a CUDA
build on a machine without a GPU) counts once, naming the builds. A skipped
test says why where its output does.
"""
import json
import re
import pathlib
import sys
import xml.etree.ElementTree as ET

NO_ASSERTION = "passed without assertions"


# A script's line for one of its checks (tests/script_cases.py).
SCRIPT_CASE = re.compile(r"^case: (?P<name>.+?): (?P<result>passed|failed|skipped)(?:: (?P<why>.*))?$", re.M)


def case_results(report: pathlib.Path) -> dict:
    """{case path: result} of one Boost XML report; a passed case that ran no
    assertion is "passed without assertions" (see merged_results)."""
    results = {}

    def walk(node, prefix):
        for child in node:
            if child.tag == "TestSuite":
                path = prefix + child.get("name", "")
                if child.get("result") == "skipped" and not any(True for _ in child.iter("TestCase")):
                    # A suite skipped as a whole (a precondition) lists no
                    # cases, only their number: count each one as skipped.
                    n = int(child.get("test_cases_skipped", "1"))
                    for k in range(n):
                        results[f"{path}/(skipped case {k + 1} of {n})"] = "skipped"
                    continue
                walk(child, path + "/")
            elif child.tag == "TestCase":
                result = child.get("result")
                ran = int(child.get("assertions_passed", "1")) + int(child.get("assertions_failed", "0"))
                if result == "passed" and ran == 0:
                    result = NO_ASSERTION
                results[prefix + child.get("name", "")] = result

    walk(ET.parse(report).getroot(), "")
    return results


def merged_results(reports: pathlib.Path, name: str):
    """Results of NAME.xml merged with its per-rank reports, or None."""
    report = reports / f"{name}.xml"
    if not report.exists() or report.stat().st_size == 0:
        return None
    merged = case_results(report)
    for extra in sorted(reports.glob(f"{name}.rank*.xml")):
        try:
            other = case_results(extra)
        except ET.ParseError:
            other = {}
        if set(other) != set(merged):
            # A rank that died before writing its report, or ran other cases.
            merged["(ranks disagree on the cases run: " + extra.name + ")"] = "failed"
        for case, r in other.items():
            if case not in merged or r not in ("passed", "skipped", NO_ASSERTION):
                merged[case] = r
            elif merged[case] == NO_ASSERTION and r == "passed":
                # Some rank asserted: the job's case checked something.
                merged[case] = "passed"
    return merged


def error_lines(output: str, case: str, limit: int = 4) -> list:
    """The lines of a suite's Boost log that report errors in CASE (its leaf
    name), at most LIMIT, each cut to 400 characters, colour codes removed;
    any error lines at all where none names the case (a fatal error outside
    a case); the last lines where there are none (a crash)."""
    leaf = case.rsplit("/", 1)[-1]
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", l).strip() for l in output.splitlines()]
    errors = [l for l in lines if "error" in l.lower()]
    named = [l for l in errors if f'/{leaf}"' in l or f'"{leaf}"' in l]
    # No error line at all (a crash, a sanitizer report): the output's end.
    chosen = named or errors or [l for l in lines if l][-limit:]
    return [l[:400] for l in chosen[:limit]]


def main(args: list) -> int:
    passed = failed = skipped = 0
    names = []
    dirs = []
    while args:
        a = args.pop(0)
        if a == "--skipped":
            skipped += 1
            names.append(f"skipped: {args.pop(0)}")
        else:
            dirs.append(a)
    skips = {}  # case -> (builds it was skipped in, why)
    for build_dir in dirs or ["build"]:
        p, f, s, n = count_build(build_dir, prefix=f"{build_dir}: " if len(dirs) > 1 else "")
        passed, failed = passed + p, failed + f
        names += n
        for case, why_skipped in s:
            builds, first_why = skips.get(case, ([], why_skipped))
            skips[case] = (builds + [build_dir], first_why)
    # A case skipped in several builds is one skip (the same device case of
    # the CPU build and of a CUDA build without a GPU), named with its builds.
    for case, (builds, why_skipped) in skips.items():
        skipped += 1
        where = f"{', '.join(builds)}: " if len(dirs) > 1 else ""
        names.append(f"skipped: {where}{case}" + (f" ({why_skipped})" if why_skipped else ""))
    # Failures last, beside the count line: a log cut to its tail (CI keeps
    # only the end) still names them after hundreds of skips.
    for n in sorted(names, key=lambda n: n.startswith("failed:")):
        print(n)
    # The skips by reason, so that a new reason (a suite that stopped running
    # here) stands out from the hundreds of device cases a CPU machine skips.
    by_reason = {}
    for _, why_skipped in skips.values():
        by_reason[why_skipped or "no reason given"] = by_reason.get(why_skipped or "no reason given", 0) + 1
    for why_skipped, n in sorted(by_reason.items(), key=lambda kv: -kv[1]):
        print(f"skips: {n} x {why_skipped}")
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


def why(entry: dict, case: str) -> str:
    """Indented error lines of a meson test log entry for CASE."""
    output = (entry.get("stdout") or "") + "\n" + (entry.get("stderr") or "")
    return "".join("\n    " + l for l in error_lines(output, case))


def last_line(entry: dict) -> str:
    """The last non-empty line a test printed: a skipped script's reason."""
    lines = [l.strip() for l in ((entry.get("stdout") or "") + "\n" + (entry.get("stderr") or "")).splitlines()]
    lines = [l for l in lines if l]
    return lines[-1][:200] if lines else ""


# Boost's log line for a unit skipped by its precondition.
BOOST_SKIP = re.compile(r'Test (?:case|suite) "(?P<unit>[^"]+)" is skipped because (?:precondition failed: )?(?P<why>.*)$')


def skip_reasons(entry: dict) -> dict:
    """{unit name: why} of the units a Boost suite's log says it skipped."""
    reasons = {}
    for line in (entry.get("stdout") or "").splitlines():
        m = BOOST_SKIP.search(re.sub(r"\x1b\[[0-9;]*m", "", line))
        if m:
            reasons[m["unit"]] = m["why"].strip()
    return reasons


def skip_reason(reasons: dict, case: str) -> str:
    """The reason for CASE (a path): its own, or that of a suite above it.
    Boost names a unit by its path below the master suite
    ("group_stats/one_dim_mesh_has_one_group"), so every tail of each
    prefix of the case's path is tried, the case's own first."""
    parts = case.split("/")
    for k in range(len(parts), 0, -1):
        for j in range(k):
            unit = "/".join(parts[j:k])
            if unit in reasons:
                return reasons[unit]
    return ""


def script_cases(entry: dict) -> dict:
    """{case: (result, why)} from a script's `case:` lines, or {}."""
    cases = {}
    for m in SCRIPT_CASE.finditer(entry.get("stdout") or ""):
        cases[m["name"]] = (m["result"], m["why"] or "")
    return cases


def count_build(build_dir: str, prefix: str):
    """(passed, failed, [(skipped case, why)], [named failures]) of one build."""
    build = pathlib.Path(build_dir)
    reports = build / "tests" / "reports"
    log = build / "meson-logs" / "testlog.json"
    passed = failed = 0
    skipped = []
    names = []
    if not log.exists():
        return 0, 1, [], [f"failed: {prefix}no meson test log"]
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        name, result = entry["name"], entry["result"]
        counted = False
        try:
            # Tests in a meson suite are logged as "project:suite / name".
            cases = merged_results(reports, name.split(" / ")[-1])
        except ET.ParseError:
            cases = None
        if cases:
            reasons = skip_reasons(entry)
            for case, r in cases.items():
                if r == "passed":
                    passed += 1
                elif r == "skipped":
                    skipped.append((f"{name}/{case}", skip_reason(reasons, case)))
                elif r == NO_ASSERTION:
                    failed += 1
                    names.append(f"failed: {prefix}{name}/{case} (it passed without running any assertion)")
                else:
                    failed += 1
                    names.append(f"failed: {prefix}{name}/{case}" + why(entry, case))
            counted = True
            # A suite that reported only passes but still failed (a crash
            # after the report, a sanitizer error at exit) is a failure.
            if result not in ("OK", "EXPECTEDFAIL") and all(r in ("passed", "skipped") for r in cases.values()):
                failed += 1
                names.append(f"failed: {prefix}{name} (exited {result} after its cases passed)" + why(entry, ""))
        checks = {} if counted else script_cases(entry)
        if checks:
            for case, (r, why_) in checks.items():
                if r == "passed":
                    passed += 1
                elif r == "skipped":
                    skipped.append((f"{name}/{case}", why_))
                else:
                    failed += 1
                    names.append(f"failed: {prefix}{name}/{case}" + (f": {why_}" if why_ else ""))
            counted = True
            # A script whose checks all passed but which still failed (an
            # error after them, a check it never reached) is a failure.
            if result not in ("OK", "EXPECTEDFAIL", "SKIP") and all(r != "failed" for r, _ in checks.values()):
                failed += 1
                names.append(f"failed: {prefix}{name} ({result} after its checks)" + why(entry, ""))
        if not counted:
            if result in ("OK", "EXPECTEDFAIL"):
                passed += 1
            elif result == "SKIP":
                skipped.append((name, last_line(entry)))
            else:
                failed += 1
                names.append(f"failed: {prefix}{name} ({result})" + why(entry, ""))
    return passed, failed, skipped, names


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
