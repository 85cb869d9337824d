"""Prints the checks of a script test, one line each, and gives its exit code."""


def report(checks) -> int:
    """checks: (name, ok, detail) tuples; a failed one prints its detail. 1 if any failed."""
    failed = 0
    for name, ok, detail in checks:
        print(f"{'ok' if ok else 'FAILED'}: {name}" + ("" if ok else f"\n  {detail}"))
        failed += not ok
    return 1 if failed else 0
