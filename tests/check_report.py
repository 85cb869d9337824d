"""The checks of a script test as `case:` lines, and its exit code (the older
form of tests/script_cases.py, kept for scripts that build a list of checks)."""
from script_cases import Cases


def report(checks) -> int:
    """checks: (name, ok, detail) tuples, each printed as one case; 1 if any failed."""
    cases = Cases()
    for name, ok, detail in checks:
        cases.check(name, ok, detail)
    return cases.finish()
