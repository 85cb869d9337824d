#!/usr/bin/env python3
"""A rank that fails mid-program must not hang the job: test_failures.py PROGRAM [--mpi]

Runs tests/failing_program with rank 1 throwing, exiting or stalling, on
thread ranks and (with --mpi) as an MPI job of 4 processes, and checks that
the job ends with a non-zero exit code, well within the deadline, with an
error that names what happened. Prints one `case:` line per run
(tests/script_cases.py), the MPI ones skipped, saying why, in a build
without MPI; exits 1 if any failed.
"""
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_mpi import mpi_sanitizer_env  # noqa: E402
from script_cases import Cases  # noqa: E402
import time

TIMEOUT_MS = 3000      # the collectives' deadline, through DTENSOR_TIMEOUT_MS
LIMIT_S = 60           # a run that takes longer counts as a hang


def run(cmd, env):
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=LIMIT_S)
        return p.returncode, p.stdout + p.stderr, time.monotonic() - t0
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() + (e.stderr or b"").decode() if isinstance(e.stdout, bytes) else ""
        return None, out, time.monotonic() - t0


def main() -> int:
    program = sys.argv[1]
    use_mpi = "--mpi" in sys.argv[2:]
    env = dict(os.environ, DTENSOR_TIMEOUT_MS=str(TIMEOUT_MS))
    env.pop("DTENSOR_BACKEND", None)
    runs = [("threads", "throw", [program, "throw", "--ranks", "4"], ["rank 1 gives up on purpose"], env),
            # The peers time out on the sleeping rank; one deadline later the
            # process names it and ends instead of joining it (10 minutes).
            ("threads", "stall", [program, "stall", "--ranks", "4"],
             ["timed out after 3000 ms waiting for rank(s) 1", "rank 1 of 4 stalled",
              "rank 1 was running user code since its"], env)]
    cases = Cases()
    mpi_modes = ["throw", "exit", "stall"]
    if use_mpi:
        mpirun = os.environ.get("DTENSOR_MPIRUN") or shutil.which("mpirun")
        menv = dict(env, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                    OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_mpi_yield_when_idle="1")
        menv.update(mpi_sanitizer_env(menv))
        job = [mpirun, "-np", "4"]
        runs += [
            ("mpi", "throw", job + [program, "throw"], ["rank 1 of 4 failed", "rank 1 gives up on purpose"], menv),
            # The launcher reports the process that died; its peers are ended.
            ("mpi", "exit", job + [program, "exit"], [], menv),
            # The peers of a stalled rank time out, name the call, abort the job.
            ("mpi", "stall", job + [program, "stall"], ["timed out after 3000 ms"], menv),
        ]
    for backend, mode, cmd, expected, case_env in runs:
        rc, out, took = run(cmd, case_env)
        problems = []
        if rc is None:
            problems.append(f"still running after {LIMIT_S} s: a hang")
        elif rc == 0:
            problems.append("exit code 0: the failure went unnoticed")
        if "finished: the failure went unnoticed" in out:
            problems.append("rank 0 finished as if nothing happened")
        for text in expected:
            if text not in out:
                problems.append(f"the output does not say '{text}'")
        detail = f"exit code {rc}, {took:.1f} s: " + "; ".join(problems)
        if problems:
            detail += "\noutput:\n" + "\n".join(out.strip().splitlines()[-15:])
        print(f"{backend:7} rank 1 {mode:5}: exit code {rc}, {took:.1f} s")
        cases.check(f"{backend}: rank 1 {mode}: the job fails within the deadline, saying what happened",
                    not problems, detail)
    if not use_mpi:
        for mode in mpi_modes:
            cases.skip(f"mpi: rank 1 {mode}: the job fails within the deadline, saying what happened",
                       "this build has no MPI (-Dmpi=disabled, or no MPI found)")
    return cases.finish()


if __name__ == "__main__":
    sys.exit(main())
