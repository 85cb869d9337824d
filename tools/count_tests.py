#!/usr/bin/env python3
"""Adds up the test cases of one meson build's last `meson test` run.

Each Boost.Test suite writes an XML report (tests/meson.build passes
--report_sink); its leaf test cases are counted one by one. A meson test
without a report (a script, or a suite that crashed before writing one) counts
as one case, passed, failed or skipped as meson saw it. Prints one line,
"N passed, N failed, N skipped", and exits 1 if anything failed.
"""
import json
import pathlib
import sys
import xml.etree.ElementTree as ET


def main(build_dir: str) -> int:
    build = pathlib.Path(build_dir)
    reports = build / "tests" / "reports"
    log = build / "meson-logs" / "testlog.json"
    passed = failed = skipped = 0
    names = []
    if not log.exists():
        print("0 passed, 1 failed, 0 skipped  (no meson test log)")
        return 1
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        name, result = entry["name"], entry["result"]
        report = reports / f"{name}.xml"
        counted = False
        if report.exists() and report.stat().st_size > 0:
            try:
                root = ET.parse(report).getroot()
                cases = list(root.iter("TestCase"))
                for case in cases:
                    r = case.get("result")
                    if r == "passed":
                        passed += 1
                    elif r == "skipped":
                        skipped += 1
                        names.append(f"skipped: {name}/{case.get('name')}")
                    else:
                        failed += 1
                        names.append(f"failed: {name}/{case.get('name')}")
                counted = bool(cases)
                # A suite that reported only passes but still failed (a crash
                # after the report, a sanitizer error at exit) is a failure.
                if counted and result not in ("OK", "EXPECTEDFAIL") and not any(
                        c.get("result") not in ("passed", "skipped") for c in cases):
                    failed += 1
                    names.append(f"failed: {name} (exited {result} after its cases passed)")
            except ET.ParseError:
                counted = False
        if not counted:
            if result in ("OK", "EXPECTEDFAIL"):
                passed += 1
            elif result == "SKIP":
                skipped += 1
                names.append(f"skipped: {name}")
            else:
                failed += 1
                names.append(f"failed: {name} ({result})")
    for n in names:
        print(n)
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "build"))
