#!/usr/bin/env bash
# Runs the benchmarks of one build directory and prints their tables; the
# README's performance section quotes this output.
#   bash bench/run.sh build           # collectives up to 64 MiB, plan cache
#   FULL=1 bash bench/run.sh build    # collectives up to 256 MiB (needs ~4 GiB)
set -euo pipefail
dir=${1:-build}
max=64
[[ ${FULL:-0} == 1 ]] && max=256
echo "== collectives on the threads backend (build/bench/collectives --max-mib=$max --best)"
"$dir/bench/collectives" --max-mib="$max" --best
echo
echo "== planner: plan-cache hit vs miss (build/bench/plan_cache)"
"$dir/bench/plan_cache" --benchmark_min_time=0.2
