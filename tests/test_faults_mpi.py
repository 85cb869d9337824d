#!/usr/bin/env python3
"""A rank that leaves an MPI job early ends the job, every time:
test_faults_mpi.py PROGRAM [RUNS]

Runs tests/failing_program as an MPI job of 4 processes RUNS times (10 by
default) for each way rank 1 can leave mid-program without an exception:
  exit_call  it calls exit(), which runs the atexit hooks (that used to
             finalise MPI under its peers: Open MPI's mpirun then crashed or
             lost the exit code in some runs);
  return     its body returns early while its peers still redistribute (that
             used to deadlock mpirun in some runs).
Every run must end with a non-zero exit code and a line naming rank 1, and
promptly: the collectives' deadline is 60 s, and a run may take LIMIT_S
(mpirun's start included), so a failure noticed only at the deadline fails
the test instead of hanging it. Prints one `case:` line per way
(tests/script_cases.py), failed if any of its runs failed, each a skip
saying why where no mpirun is found; exits 1 if any failed.
"""
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_mpi import mpi_sanitizer_env  # noqa: E402
from script_cases import Cases  # noqa: E402

TIMEOUT_MS = 60000  # the collectives' deadline, through DTENSOR_TIMEOUT_MS
LIMIT_S = 20        # a run that takes longer counts as a hang

# mode -> text that must appear in the output (naming the rank that left)
CASES = {
    "exit_call": "rank 1 of 4 exited in the middle of the program",
    "return": "rank 1 returned from its program",
}


def run_once(cmd, env):
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=LIMIT_S)
        return p.returncode, p.stdout + p.stderr, time.monotonic() - t0
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return None, out + err, time.monotonic() - t0


def main() -> int:
    program = sys.argv[1]
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    cases = Cases()
    mpirun = os.environ.get("DTENSOR_MPIRUN") or shutil.which("mpirun") or shutil.which("mpiexec")
    if not mpirun:
        for mode in CASES:
            cases.skip(f"rank 1 {mode}: every one of {runs} MPI jobs ends non-zero, promptly, naming it",
                       "no mpirun or mpiexec on PATH")
        return cases.finish()
    env = dict(os.environ, DTENSOR_TIMEOUT_MS=str(TIMEOUT_MS), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1",
               OMPI_MCA_mpi_yield_when_idle="1")
    env.pop("DTENSOR_BACKEND", None)
    env.update(mpi_sanitizer_env(env))
    for mode, expected in CASES.items():
        bad = []
        times = []
        for i in range(runs):
            rc, out, took = run_once([mpirun, "-np", "4", program, mode], env)
            times.append(took)
            problems = []
            if rc is None:
                problems.append(f"still running after {LIMIT_S} s: a hang")
            elif rc == 0:
                problems.append("exit code 0: the failure went unnoticed")
            elif rc < 0:
                problems.append(f"mpirun died of signal {-rc}")
            if "finished: the failure went unnoticed" in out:
                problems.append("rank 0 finished as if nothing happened")
            if expected not in out:
                problems.append(f"the output does not say '{expected}'")
            if problems:
                bad.append((i, rc, problems, out))
        print(f"mpi rank 1 {mode:9}: {runs} runs, {min(times):.1f}-{max(times):.1f} s each")
        detail = f"failed in {len(bad)} of {runs} runs: " + "; ".join(
            f"run {i}: exit code {rc}: {', '.join(problems)}" for i, rc, problems, _ in bad)
        for i, rc, problems, out in bad:
            detail += f"\nrun {i}:\n" + "\n".join(out.strip().splitlines()[-12:])
        cases.check(f"rank 1 {mode}: every one of {runs} MPI jobs ends non-zero, promptly, naming it", not bad,
                    detail)
    return cases.finish()


if __name__ == "__main__":
    sys.exit(main())
