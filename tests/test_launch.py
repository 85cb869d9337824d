#!/usr/bin/env python3
"""One program, two engines: test_launch.py DEMO DTENSOR_PLAN MLP [--mpi]

Checks launch(): the demo prints the same on 8 thread ranks as on an MPI job
of 8 processes (and on 8 simulated GPU ranks where a GPU is present; else
--device cuda is refused clearly); --ranks and DTENSOR_RANKS choose the
thread ranks; a --ranks
that contradicts mpirun's -np is refused with exit code 2; dtensor-plan --run
verifies its plan on MPI processes; the bf16 tensor-parallel MLP example
costs exactly one all_reduce and matches f32 on threads (and on simulated
GPU ranks or MPI processes where those exist). Prints one line per check;
exits 1 if any failed.
"""
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_mpi import mpi_sanitizer_env  # noqa: E402


def run(cmd, env=None):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def main() -> int:
    demo, plan, mlp = sys.argv[1], sys.argv[2], sys.argv[3]
    use_mpi = "--mpi" in sys.argv[4:]
    env = dict(os.environ)
    env.pop("DTENSOR_BACKEND", None)
    env.pop("DTENSOR_RANKS", None)
    checks = []

    rc, threads_out, err = run([demo, "--ranks", "8"], env)
    checks.append(("demo --ranks 8 succeeds", rc == 0 and "all shards matched" in threads_out, err))
    rc, env_out, err = run([demo], dict(env, DTENSOR_RANKS="4"))
    checks.append(("DTENSOR_RANKS=4 runs the demo on 4 ranks", rc == 0 and "4 ranks as a 2x2 mesh" in env_out, err))
    rc, _, err = run([demo, "--ranks", "3"], env)
    checks.append(("an odd --ranks is refused with a message", rc != 0 and "even number of ranks" in err, err))

    rc, _, err = run([demo, "--ranks", "4"], dict(env, DTENSOR_DEVICE="tpu"))
    checks.append(("DTENSOR_DEVICE=tpu is refused (exit 2) naming the choices",
                   rc == 2 and "expected cpu or cuda" in err, err))
    rc, cuda_out, err = run([demo, "--ranks", "8", "--device", "cuda"], env)
    if rc == 0:
        # A GPU is here: the simulated GPU ranks print what the CPU ranks print.
        checks.append(("demo --ranks 8 --device cuda prints exactly what demo --ranks 8 prints",
                       cuda_out == threads_out, err))
    else:
        checks.append(("--device cuda without a usable GPU exits 2 saying what is missing",
                       rc == 2 and ("needs CUDA" in err or "needs a CUDA device" in err), err))

    def mlp_ok(out):
        return "all_reduce x1 (" in out and "1 collective," in out and ": ok" in out

    rc, out, err = run([mlp, "--ranks", "4"], env)
    checks.append(("the bf16 MLP on 2x2 thread ranks: one all_reduce, within tolerance of f32",
                   rc == 0 and mlp_ok(out), err + out))
    rc, out, err = run([mlp, "--ranks", "4", "--device", "cuda"], env)
    if rc != 2:  # 2: no GPU here (checked above with the demo)
        checks.append(("the bf16 MLP on 4 simulated GPU ranks: one all_reduce, within tolerance of f32",
                       rc == 0 and mlp_ok(out), err + out))

    if use_mpi:
        mpirun = os.environ.get("DTENSOR_MPIRUN") or shutil.which("mpirun")
        menv = dict(env, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                    OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_mpi_yield_when_idle="1")
        menv.update(mpi_sanitizer_env(menv))
        rc, mpi_out, err = run([mpirun, "-np", "8", demo], menv)
        checks.append(("mpirun -np 8 demo succeeds", rc == 0, err))
        checks.append(("mpirun -np 8 demo prints exactly what demo --ranks 8 prints", mpi_out == threads_out,
                       "first difference near: " + next((f"{a!r} vs {b!r}" for a, b in
                                                         zip(threads_out.splitlines(), mpi_out.splitlines()) if a != b),
                                                        "(lengths differ)")))
        rc, out, err = run([mpirun, "-np", "4", mlp], menv)
        checks.append(("the bf16 MLP on 4 MPI processes: one all_reduce, within tolerance of f32",
                       rc == 0 and mlp_ok(out), err + out))
        rc, _, err = run([mpirun, "-np", "4", demo, "--ranks", "8"], menv)
        checks.append(("--ranks 8 under mpirun -np 4 is refused (exit 2)",
                       "expected them to agree" in err and rc != 0, err))
        rc, out, err = run([mpirun, "-np", "4", plan, "--mesh", "2x4", "--shape", "12,10", "--from", "P(sum),S(1)",
                            "--to", "R,S(0)", "--run"], menv)
        checks.append(("dtensor-plan --run --mesh 2x4 under mpirun -np 4 is refused (exit 2)",
                       rc == 2 and "--mesh '2x4' has 8 ranks, but the MPI job has 4 processes" in err, err + out[-500:]))
        rc, out, err = run([mpirun, "-np", "8", plan, "--mesh", "2x4", "--shape", "12,10", "--from", "P(sum),S(1)",
                            "--to", "R,S(0)", "--run"], menv)
        checks.append(("dtensor-plan --run verifies its plan on 8 MPI processes",
                       rc == 0 and "MPI job of 8 processes" in out and "verified: yes" in out, err + out[-500:]))

    failed = 0
    for name, ok, detail in checks:
        print(f"{'ok    ' if ok else 'FAILED'} {name}")
        if not ok:
            failed += 1
            print("    " + "\n    ".join(detail.strip().splitlines()[-10:]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
