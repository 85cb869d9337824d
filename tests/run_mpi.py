#!/usr/bin/env python3
"""Runs one test binary as an MPI job: run_mpi.py NP REPORT_DIR NAME EXE [ARGS...]

Each rank writes its own Boost XML report: rank 0 to REPORT_DIR/NAME.xml and
rank r to REPORT_DIR/NAME.rank<r>.xml (tools/count_tests.py merges them: a
case fails if it failed on any rank). Works with Open MPI and MPICH: Open MPI
is told through its environment to allow root and oversubscription (these
machines have fewer cores than ranks); MPICH allows both by default.
"""
import os
import shutil
import subprocess
import sys


def mpi_sanitizer_env(env):
    """Under ./dev sanitize: no leak check in MPI processes. The MPI runtime
    keeps memory until exit on purpose, in plugins it unloads before
    LeakSanitizer reports, so no suppression can name them; address and
    undefined-behaviour checks stay on."""
    opts = env.get("ASAN_OPTIONS")
    return {"ASAN_OPTIONS": opts + ":detect_leaks=0"} if opts else {}


def main() -> int:
    np, report_dir, name, exe, *args = sys.argv[1:]
    # meson passes the launcher of the MPI the build uses (-Dmpi_launcher).
    mpirun = os.environ.get("DTENSOR_MPIRUN") or shutil.which("mpirun") or shutil.which("mpiexec")
    if not mpirun:
        print("run_mpi.py: no mpirun on PATH", file=sys.stderr)
        return 2
    env = dict(os.environ)
    env.update({
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "OMPI_MCA_rmaps_base_oversubscribe": "1",
        # Blocking waits must yield the core when ranks outnumber cores.
        "OMPI_MCA_mpi_yield_when_idle": "1",
    })
    env.update(mpi_sanitizer_env(env))
    for old in os.listdir(report_dir):
        if old.startswith(name + ".rank"):
            os.remove(os.path.join(report_dir, old))
    # A tiny shell per rank picks its report file from the rank the launcher
    # exported (Open MPI or PMI).
    per_rank = ('r=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}; '
                'if [ "$r" = 0 ]; then sink="$1/$2.xml"; else sink="$1/$2.rank$r.xml"; fi; '
                'shift 2; exec "$@" --report_sink="$sink"')
    cmd = [mpirun, "-np", np, "sh", "-c", per_rank, "sh", report_dir, name, exe, *args]
    return subprocess.call(cmd, env=env)


if __name__ == "__main__":
    sys.exit(main())
