#!/usr/bin/env bash
# The real-size job benchmark on the GPU machine (2 H200s: modes run two at a time).
#   bash benchmarks/realsize_h200.sh RES "MODES_GPU0" "MODES_GPU1" [extra run args...]
# Writes benchmarks/bench_job_realsize.py's rows under /tmp/bcgen-realsize and the report to $OUT.
set -u
res=$1; m0=$2; m1=$3; shift 3
dir=/tmp/sana16
b=benchmarks/bench_job_realsize.py
[ -f $dir/model_index.json ] || python3 $b build --dir $dir 2>&1 | grep -v Warn | tail -2
run() { CUDA_VISIBLE_DEVICES=$1 python3 $b run --dir $dir --res $res --modes "$2" "${@:3}"; }
[ -n "$m0" ] && { run 0 "$m0" "$@" > "$OUT/run-$res-gpu0.log" 2>&1 & }
[ -n "$m1" ] && { run 1 "$m1" "$@" > "$OUT/run-$res-gpu1.log" 2>&1 & }
wait
tail -n 4 "$OUT"/run-$res-gpu*.log
python3 $b report --res $res --out "$OUT" --commands "bash benchmarks/realsize_h200.sh $res '$m0' '$m1' $*"
