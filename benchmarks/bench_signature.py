"""Signature cost and the runner's host overhead per replay.

    python benchmarks/bench_signature.py --out benchmarks/results

1. `signature()` µs per call for the kwargs SanaPipeline passes its transformer, alone and with a
   72,000-element list of None (flat, and nested as 720 lists of 100), with the fast paths and
   without them (item-by-item walk) for contrast.
2. On a GPU: host time of one runner call that replays (signature + input copies + graph launch +
   output clone), against the graph launch alone, on SANA-1.6B-shaped calls (the model cut to
   2 layers so the host, not the GPU, is what we time; the call's arguments are the 1.6B ones).
   Host time is read without synchronizing inside a batch of calls: the GPU queue never fills.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import build_sana, device_tag, environment, sync, write_results  # noqa: E402

from bcg import RunnerConfig, apply_graph_runner  # noqa: E402
from bcg.entry import copy_into  # noqa: E402
from bcg.tree import clone_tree  # noqa: E402

# `bcg.signature` the attribute is the function; the module holds the fast-path threshold.
sigmod = importlib.import_module("bcg.signature")

COLUMNS = ["case", "us_per_call", "us_min", "note"]


def per_call_us(fn, calls: int = 200, repeats: int = 7, sync_each_batch: bool = False) -> tuple[float, float]:
    """Median and min over `repeats` batches of the host µs per call."""
    fn()
    samples = []
    for _ in range(repeats):
        if sync_each_batch:
            sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
        if sync_each_batch:
            sync()
    return statistics.median(samples), min(samples)


def sana_kwargs(device: str, batch: int = 1, side: int = 16, text: int = 300) -> dict:
    dt = torch.bfloat16
    return dict(
        hidden_states=torch.randn(2 * batch, 32, side, side, device=device, dtype=dt),
        encoder_hidden_states=torch.randn(2 * batch, text, 2304, device=device, dtype=dt),
        encoder_attention_mask=torch.ones(2 * batch, text, dtype=torch.int64, device=device),
        timestep=torch.tensor(500.0, device=device).expand(2 * batch).to(dt),
        return_dict=False,
        attention_kwargs=None,
    )


def signature_rows(device: str) -> list[dict]:
    kw = sana_kwargs(device)
    cases = {
        "sana kwargs": kw,
        "sana kwargs + [None]*72000": {**kw, "extra": [None] * 72_000},
        "sana kwargs + 720 lists of 100 None": {**kw, "extra": [[None] * 100 for _ in range(720)]},
    }
    rows = []
    for name, kwargs in cases.items():
        med, lo = per_call_us(lambda: sigmod.signature((), kwargs), calls=100)
        rows.append({"case": f"signature: {name}", "us_per_call": round(med, 2), "us_min": round(lo, 2),
                     "note": "fast paths on"})
        if "extra" in kwargs:
            saved, sigmod._RUN_MIN = sigmod._RUN_MIN, 10**12  # the item-by-item walk, for contrast
            try:
                med, lo = per_call_us(lambda: sigmod.signature((), kwargs), calls=5, repeats=3)
            finally:
                sigmod._RUN_MIN = saved
            rows.append({"case": f"signature: {name}", "us_per_call": round(med, 1), "us_min": round(lo, 1),
                         "note": "fast paths off (item-by-item walk)"})
    return rows


def replay_rows(policy: str) -> list[dict]:
    model = build_sana("cuda", num_layers=2)
    kw = sana_kwargs("cuda")
    runner = apply_graph_runner(model, RunnerConfig(backend="cuda"), break_policy=policy)
    rows = []
    try:
        with torch.no_grad():
            model(**kw)  # capture
            entry = runner.entries()[0]
            # 20 calls a batch: ~20 launches a call stays far below the GPU's launch queue depth,
            # so the host never waits for the GPU inside a batch.
            call, call_lo = per_call_us(lambda: model(**kw), calls=20, sync_each_batch=True)
            runner_only, _ = per_call_us(lambda: runner(**kw), calls=20, sync_each_batch=True)
            launch, _ = per_call_us(entry.graph.replay, calls=20, sync_each_batch=True)
            sig, _ = per_call_us(lambda: sigmod.flatten((), kw), calls=200)
            leaves = sigmod.flatten((), kw)[1]

            cp, _ = per_call_us(lambda: copy_into(entry.static_inputs, leaves), calls=20,
                                sync_each_batch=True)
            cl, _ = per_call_us(lambda: clone_tree(entry.output), calls=20, sync_each_batch=True)
        stats = runner.stats()
    finally:
        runner.remove()
    tag = f"policy {policy}, {entry.segments} segment(s)"
    rows += [
        {"case": f"replay call via module (nn.Module.__call__ + runner): {tag}", "us_per_call": round(call, 1),
         "us_min": round(call_lo, 1), "note": f"hits={stats['hits']}"},
        {"case": f"replay call via runner: {tag}", "us_per_call": round(runner_only, 1), "us_min": None,
         "note": "signature + copies + graph launch(es) + clone"},
        {"case": f"graph replay alone (segments + breaks): {tag}", "us_per_call": round(launch, 1), "us_min": None,
         "note": "the launch cost a hand-written graph call also pays"},
        {"case": f"host overhead per replay: {tag}", "us_per_call": round(runner_only - launch, 1), "us_min": None,
         "note": "runner call minus graph replay; target < 100 µs"},
        {"case": "  of which signature (flatten)", "us_per_call": round(sig, 1), "us_min": None, "note": ""},
        {"case": "  of which input copies (4 tensors: 1 fused + 1 expanded)", "us_per_call": round(cp, 1), "us_min": None, "note": ""},
        {"case": "  of which output clone", "us_per_call": round(cl, 1), "us_min": None, "note": ""},
    ]
    del model
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    rows = signature_rows("cuda" if cuda else "cpu")
    if cuda:
        rows += replay_rows("none") + replay_rows("attention")
    notes = ["µs per call: median over batches (min where given); host wall clock, perf_counter",
             "replay rows: SANA-1.6B call arguments (CFG batch 2, 16x16 latents, text 300), model cut "
             "to 2 layers so the host is timed, not the GPU"]
    write_results(args.out, f"signature_{device_tag()}", rows, COLUMNS, notes, environment())
    for r in rows:
        print(r, flush=True)


if __name__ == "__main__":
    main()
