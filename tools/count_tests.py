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
"""
import json
import re
import pathlib
import sys
import xml.etree.ElementTree as ET


def case_results(report: pathlib.Path) -> dict:
    """{case path: result} of one Boost XML report."""
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
                results[prefix + child.get("name", "")] = child.get("result")

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
            if r not in ("passed", "skipped") or case not in merged:
                merged[case] = r
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
    for build_dir in dirs or ["build"]:
        p, f, s, n = count_build(build_dir, prefix=f"{build_dir}: " if len(dirs) > 1 else "")
        passed, failed, skipped = passed + p, failed + f, skipped + s
        names += n
    # Failures last, beside the count line: a log cut to its tail (CI keeps
    # only the end) still names them after hundreds of skips.
    for n in sorted(names, key=lambda n: n.startswith("failed:")):
        print(n)
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


def why(entry: dict, case: str) -> str:
    """Indented error lines of a meson test log entry for CASE."""
    output = (entry.get("stdout") or "") + "\n" + (entry.get("stderr") or "")
    return "".join("\n    " + l for l in error_lines(output, case))


def count_build(build_dir: str, prefix: str):
    build = pathlib.Path(build_dir)
    reports = build / "tests" / "reports"
    log = build / "meson-logs" / "testlog.json"
    passed = failed = skipped = 0
    names = []
    if not log.exists():
        return 0, 1, 0, [f"failed: {prefix}no meson test log"]
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
            for case, r in cases.items():
                if r == "passed":
                    passed += 1
                elif r == "skipped":
                    skipped += 1
                    names.append(f"skipped: {prefix}{name}/{case}")
                else:
                    failed += 1
                    names.append(f"failed: {prefix}{name}/{case}" + why(entry, case))
            counted = True
            # A suite that reported only passes but still failed (a crash
            # after the report, a sanitizer error at exit) is a failure.
            if result not in ("OK", "EXPECTEDFAIL") and all(r in ("passed", "skipped") for r in cases.values()):
                failed += 1
                names.append(f"failed: {prefix}{name} (exited {result} after its cases passed)" + why(entry, ""))
        if not counted:
            if result in ("OK", "EXPECTEDFAIL"):
                passed += 1
            elif result == "SKIP":
                skipped += 1
                names.append(f"skipped: {prefix}{name}")
            else:
                failed += 1
                names.append(f"failed: {prefix}{name} ({result})" + why(entry, ""))
    return passed, failed, skipped, names


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
