#!/usr/bin/env bash
# Runs the benchmarks of one build directory and prints their tables
# (bench/README.md quotes them).
#   bash bench/run.sh build           # collectives up to 64 MiB, plan cache, pipeline, moe;
#                                     # under MPI: 2 processes, 16 MiB, moe, matmul --quick
#   FULL=1 bash bench/run.sh build    # collectives up to 256 MiB (needs ~4 GiB);
#                                     # under MPI: 2 and 4 processes, 64 MiB, matmul N=2048,4096
set -euo pipefail
dir=${1:-build}
full=${FULL:-0}
max=64
[[ $full == 1 ]] && max=256
echo "== collectives on the threads backend (build/bench/collectives --max-mib=$max --best)"
"$dir/bench/collectives" --max-mib="$max" --best
echo
echo "== planner: plan-cache hit vs miss (build/bench/plan_cache)"
"$dir/bench/plan_cache" --benchmark_min_time=0.2
echo
echo "== pipeline schedules: measured against simulated (build/bench/pipeline; p = 4, m = 8, about 2 minutes)"
"$dir/bench/pipeline"
echo
echo "== expert parallelism: the MoE exchange vs memcpy, MoE vs dense training on ep = 2 (build/bench/moe)"
"$dir/bench/moe"

# The MPI section needs mpirun and a build with MPI (collectives then has its
# MPI mode compiled in; matmul exists only with ScaLAPACK and OpenBLAS too).
if ! command -v mpirun >/dev/null; then
  echo; echo "== MPI benchmarks skipped: no mpirun on PATH"
  exit 0
fi
if ! grep -q 'collectives_mpi\.cpp' "$dir/build.ninja" 2>/dev/null; then
  echo; echo "== MPI benchmarks skipped: $dir was built without MPI"
  exit 0
fi
# Open MPI refuses root unless told, and more processes than cores unless told.
[[ $(id -u) == 0 ]] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi_run() {
  local np=$1; shift
  local extra=()
  (( np > $(nproc) )) && extra=(--oversubscribe)
  mpirun "${extra[@]}" -np "$np" "$@"
}
procs=(2)
mpi_max=16
matmul_sizes=(--quick)
if [[ $full == 1 ]]; then
  procs=(2 4)
  mpi_max=64
  matmul_sizes=("--n=2048,4096")
fi
for np in "${procs[@]}"; do
  echo
  echo "== collectives on the MPI backend vs bare MPI (mpirun -np $np build/bench/collectives --max-mib=$mpi_max)"
  mpi_run "$np" "$dir/bench/collectives" --max-mib="$mpi_max"
done
for np in "${procs[@]}"; do
  echo
  echo "== expert parallelism on the MPI backend vs bare MPI_Alltoallv (mpirun -np $np build/bench/moe --max-mib=$mpi_max)"
  mpi_run "$np" "$dir/bench/moe" --max-mib="$mpi_max"
done
if [[ -x $dir/bench/matmul ]]; then
  for np in "${procs[@]}"; do
    echo
    echo "== distributed matmul: DTensor vs ScaLAPACK pdgemm vs OpenBLAS (mpirun -np $np build/bench/matmul ${matmul_sizes[*]})"
    mpi_run "$np" "$dir/bench/matmul" "${matmul_sizes[@]}"
  done
else
  echo; echo "== matmul skipped: $dir has no bench/matmul (needs MPI, ScaLAPACK and OpenBLAS)"
fi
