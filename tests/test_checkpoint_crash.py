#!/usr/bin/env python3
"""A save killed mid-way leaves the previous checkpoint: test_checkpoint_crash.py PROGRAM [--mpi]

tests/checkpoint_program saves a checkpoint of 1.0, then starts a save of
2.0 in which rank 2 is killed (SIGKILL) just before it writes its file, the
other ranks having written theirs: on 4 thread ranks (the whole process
dies) and, with --mpi, as a 4-process MPI job (one process dies and the job
is aborted). Each time the killed run must fail, the checkpoint must still
load as 1.0 with every checksum verified, and the next save (3.0) must
replace it. Prints one `case:` line per check (tests/script_cases.py), the
MPI ones skipped, saying why, in a build without MPI; exits 1 if any
failed.
"""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_mpi import mpi_sanitizer_env  # noqa: E402
from script_cases import Cases  # noqa: E402

LIMIT_S = 120
# The checks made for each launcher, in order.
CHECKS = FIRST, KILLED, MID_SAVE, INTACT, REPLACED = (
    "the first save", "the save with rank 2 killed fails",
    "it was killed mid-save (the staging directory holds other ranks' files)",
    "the older checkpoint loads intact", "the next save replaces it")


def run(cmd, env):
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=LIMIT_S)
        return p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired:
        return None, f"still running after {LIMIT_S} s: a hang"


def main() -> int:
    program = sys.argv[1]
    env = dict(os.environ, DTENSOR_TIMEOUT_MS="5000")
    env.pop("DTENSOR_BACKEND", None)
    env.pop("DTENSOR_RANKS", None)
    launchers = [("4 thread ranks", [], ["--ranks", "4"], env)]
    if "--mpi" in sys.argv[2:]:
        mpirun = os.environ.get("DTENSOR_MPIRUN") or shutil.which("mpirun")
        menv = dict(env, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                    OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_mpi_yield_when_idle="1")
        menv.update(mpi_sanitizer_env(menv))
        launchers.append(("mpirun -np 4", [mpirun, "-np", "4"], [], menv))
    cases = Cases()
    for name, launcher, ranks, run_env in launchers:
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = os.path.join(tmp, "ckpt")
            rc, out = run([*launcher, program, "save", ckpt, "1", *ranks], run_env)
            cases.check(f"{name}: {FIRST}", rc == 0, out)
            rc, out = run([*launcher, program, "save", ckpt, "2", "--kill-rank", "2", *ranks], run_env)
            cases.check(f"{name}: {KILLED}", rc not in (0, None), f"rc {rc}: {out}")
            cases.check(f"{name}: {MID_SAVE}",
                        os.path.isdir(ckpt + ".saving") and
                        any(f.endswith(".safetensors") for f in os.listdir(ckpt + ".saving")),
                        os.listdir(tmp))
            rc, out = run([program, "check", ckpt, "1"], env)
            cases.check(f"{name}: {INTACT}", rc == 0, out)
            rc, out = run([*launcher, program, "save", ckpt, "3", *ranks], run_env)
            rc2, out2 = run([program, "check", ckpt, "3"], env)
            cases.check(f"{name}: {REPLACED}", rc == 0 and rc2 == 0 and
                        not os.path.exists(ckpt + ".saving"), out + out2)
    if len(launchers) == 1:
        for check in CHECKS:
            cases.skip(f"mpirun -np 4: {check}", "this build has no MPI (-Dmpi=disabled, or no MPI found)")
    return cases.finish()


if __name__ == "__main__":
    sys.exit(main())
