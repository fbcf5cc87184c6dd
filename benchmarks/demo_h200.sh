#!/usr/bin/env bash
# Train the demo model and measure its prompt adherence, in one call on the GPU machine.
#   bash benchmarks/demo_h200.sh SLIM_MINILM_DIR [train_demo.py args...]
# SLIM_MINILM_DIR: `python tools/slim_minilm.py slim DIR` made here (the machine has no MiniLM
# package). Writes the weights into jobs/data/demo/ (and the preset's scaling_factor), then copies
# them, the training log and record and the adherence results to $OUT (7 files). The weights are
# copied before the adherence run starts, so a run cut short still returns them.
# `--resume jobs/data/demo` trains the shipped transformer on (their VAE kept): the trainer reads
# the folder before it overwrites it.
# ADHERENCE_MODES (env) picks bench_adherence.py's modes; default: all seven.
set -u -o pipefail
slim=$1; shift
t0=$SECONDS
python3 tools/slim_minilm.py expand "$slim" /tmp/minilm 2>&1 | tail -1
PYTHONUNBUFFERED=1 python3 tools/train_demo.py --out jobs/data/demo --write-preset --text-encoder /tmp/minilm "$@" \
    2>&1 | tee "$OUT/train.log" | grep -v " step " || { echo "training failed"; exit 1; }
cp jobs/data/demo/transformer.safetensors jobs/data/demo/vae.safetensors jobs/data/demo/config.json \
   jobs/data/demo/training.json "$OUT/"
echo "trained and copied after $((SECONDS - t0)) s"
python3 benchmarks/bench_adherence.py --out "$OUT" --tag h200 --parallel 6 --work /tmp/adherence \
    --modes "${ADHERENCE_MODES:-eager,job,job-graphs,job-eager,job-nopad,job-b1,job-b8}" \
    --extra device=cuda model.tiny.text_encoder=/tmp/minilm plan.workers=2 2>&1 | tail -n 12
tail -n 12 /tmp/adherence/job.log
echo "done after $((SECONDS - t0)) s"
