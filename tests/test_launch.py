#!/usr/bin/env python3
"""One program, two engines: test_launch.py DEMO DTENSOR_PLAN MLP [--mpi] [--cuda]

Checks launch(): the demo prints the same on 8 thread ranks as on an MPI job
of 8 processes (and on 8 simulated GPU ranks where a GPU is present; else
--device cuda is refused clearly); --ranks and DTENSOR_RANKS choose the
thread ranks; a --ranks
that contradicts mpirun's -np is refused with exit code 2; dtensor-plan --run
verifies its plan on MPI processes; the bf16 tensor-parallel MLP example
costs exactly one all_reduce and matches f32 on threads (and on simulated
GPU ranks or MPI processes where those exist).

--mpi: the build has MPI; --cuda: the build has CUDA. Whether a GPU is here
is asked of the machine (nvidia-smi, /proc/driver/nvidia), not of the
programs, so that a CUDA build on a GPU machine that refuses --device cuda
fails instead of passing as "no GPU". Prints one `case:` line per check
(tests/script_cases.py), each check that cannot run here a skip saying why;
exits 1 if any failed.
"""
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_mpi import mpi_sanitizer_env  # noqa: E402
from script_cases import Cases  # noqa: E402


def run(cmd, env=None):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def gpu_here():
    """Whether this machine has an NVIDIA GPU that CUDA may use: listed by
    nvidia-smi or the driver, and not hidden by CUDA_VISIBLE_DEVICES."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1", "none", "NoDevFiles"):
        return False
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            p = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
            if p.returncode == 0 and any(line.startswith("GPU ") for line in p.stdout.splitlines()):
                return True
        except (OSError, subprocess.TimeoutExpired):
            pass
    gpus = "/proc/driver/nvidia/gpus"
    return os.path.isdir(gpus) and bool(os.listdir(gpus))


def main() -> int:
    demo, plan, mlp = sys.argv[1], sys.argv[2], sys.argv[3]
    use_mpi = "--mpi" in sys.argv[4:]
    cuda_build = "--cuda" in sys.argv[4:]
    gpu = cuda_build and gpu_here()
    env = dict(os.environ)
    env.pop("DTENSOR_BACKEND", None)
    env.pop("DTENSOR_RANKS", None)
    cases = Cases()

    rc, threads_out, err = run([demo, "--ranks", "8"], env)
    cases.check("demo --ranks 8 succeeds", rc == 0 and "all shards matched" in threads_out, err)
    rc, env_out, err = run([demo], dict(env, DTENSOR_RANKS="4"))
    cases.check("DTENSOR_RANKS=4 runs the demo on 4 ranks", rc == 0 and "4 ranks as a 2x2 mesh" in env_out, err)
    rc, _, err = run([demo, "--ranks", "3"], env)
    cases.check("an odd --ranks is refused with a message", rc != 0 and "even number of ranks" in err, err)

    rc, _, err = run([demo, "--ranks", "4"], dict(env, DTENSOR_DEVICE="tpu"))
    cases.check("DTENSOR_DEVICE=tpu is refused (exit 2) naming the choices",
                rc == 2 and "expected cpu or cuda" in err, err)

    # --device cuda: run where a GPU is here, refused (exit 2, saying what is
    # missing) where not; which of the two is decided by the machine.
    no_gpu = "no GPU on this machine" if cuda_build else "this build has no CUDA (-Dcuda=disabled)"
    missing = "needs a CUDA device" if cuda_build else "needs CUDA, and this build has none"
    rc, cuda_out, err = run([demo, "--ranks", "8", "--device", "cuda"], env)
    on_gpu = "demo --ranks 8 --device cuda prints exactly what demo --ranks 8 prints"
    refused = "demo --device cuda without a usable GPU exits 2 saying what is missing"
    if gpu:
        cases.check(on_gpu, rc == 0 and cuda_out == threads_out, f"rc {rc}: {err}")
        cases.skip(refused, "a GPU is here")
    else:
        cases.skip(on_gpu, no_gpu)
        cases.check(refused, rc == 2 and missing in err, f"rc {rc}: {err}")

    def mlp_ok(out):
        return "all_reduce x1 (" in out and "1 collective," in out and ": ok" in out

    rc, out, err = run([mlp, "--ranks", "4"], env)
    cases.check("the bf16 MLP on 2x2 thread ranks: one all_reduce, within tolerance of f32",
                rc == 0 and mlp_ok(out), err + out)
    rc, out, err = run([mlp, "--ranks", "4", "--device", "cuda"], env)
    on_gpu = "the bf16 MLP on 4 simulated GPU ranks: one all_reduce, within tolerance of f32"
    refused = "the bf16 MLP --device cuda without a usable GPU exits 2 saying what is missing"
    if gpu:
        cases.check(on_gpu, rc == 0 and mlp_ok(out), err + out)
        cases.skip(refused, "a GPU is here")
    else:
        cases.skip(on_gpu, no_gpu)
        cases.check(refused, rc == 2 and missing in err, f"rc {rc}: {err}")

    mpi_checks = ["mpirun -np 8 demo succeeds", "mpirun -np 8 demo prints exactly what demo --ranks 8 prints",
                  "the bf16 MLP on 4 MPI processes: one all_reduce, within tolerance of f32",
                  "--ranks 8 under mpirun -np 4 is refused (exit 2)",
                  "dtensor-plan --run --mesh 2x4 under mpirun -np 4 is refused (exit 2)",
                  "dtensor-plan --run verifies its plan on 8 MPI processes"]
    if not use_mpi:
        for name in mpi_checks:
            cases.skip(name, "this build has no MPI (-Dmpi=disabled, or no MPI found)")
        return cases.finish()
    mpirun = os.environ.get("DTENSOR_MPIRUN") or shutil.which("mpirun")
    menv = dict(env, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_mpi_yield_when_idle="1")
    menv.update(mpi_sanitizer_env(menv))
    rc, mpi_out, err = run([mpirun, "-np", "8", demo], menv)
    cases.check(mpi_checks[0], rc == 0, err)
    cases.check(mpi_checks[1], mpi_out == threads_out,
                "first difference near: " + next((f"{a!r} vs {b!r}" for a, b in
                                                  zip(threads_out.splitlines(), mpi_out.splitlines()) if a != b),
                                                 "(lengths differ)"))
    rc, out, err = run([mpirun, "-np", "4", mlp], menv)
    cases.check(mpi_checks[2], rc == 0 and mlp_ok(out), err + out)
    rc, _, err = run([mpirun, "-np", "4", demo, "--ranks", "8"], menv)
    cases.check(mpi_checks[3], "expected them to agree" in err and rc != 0, err)
    rc, out, err = run([mpirun, "-np", "4", plan, "--mesh", "2x4", "--shape", "12,10", "--from", "P(sum),S(1)",
                        "--to", "R,S(0)", "--run"], menv)
    cases.check(mpi_checks[4], rc == 2 and "--mesh '2x4' has 8 ranks, but the MPI job has 4 processes" in err,
                err + out[-500:])
    rc, out, err = run([mpirun, "-np", "8", plan, "--mesh", "2x4", "--shape", "12,10", "--from", "P(sum),S(1)",
                        "--to", "R,S(0)", "--run"], menv)
    cases.check(mpi_checks[5], rc == 0 and "MPI job of 8 processes" in out and "verified: yes" in out,
                err + out[-500:])
    return cases.finish()


if __name__ == "__main__":
    sys.exit(main())
