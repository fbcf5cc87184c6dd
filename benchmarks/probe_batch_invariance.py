"""Where a row's bytes depend on its batch, on the CPU: tiny presets, op by op (issue 30).

For each family: the transformer inputs of one real pipeline call for 16 rows (CFG doubles them),
cut to batch 1, 2, 3, 8, 16; is row 0's output the same bytes? Then, op by op (bcg.invariant.trace),
which aten ops compute row 0 differently at batch 16 than at batch 1 (the *origins*). The same for
the family's VAE decode on random latents. Mode off, then on (bcg.invariant).

    python benchmarks/probe_batch_invariance.py --out benchmarks/results     # ~10 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bcg.invariant import batch_invariant, compare_rows  # noqa: E402
from tests.helpers import tiny_pipeline  # noqa: E402
from tests.invariance_rows import run_transformer, take_rows, transformer_inputs  # noqa: E402

PRESETS = ["sana_tiny", "flux_tiny", "qwen_image_tiny", "wan_tiny", "z_image_tiny"]
SIZES = (2, 3, 8, 16)


def latent_shape(preset: str):
    return {"sana_tiny": (8, 16, 16), "flux_tiny": (4, 16, 16), "z_image_tiny": (4, 16, 16),
            "qwen_image_tiny": (4, 1, 16, 16), "wan_tiny": (16, 3, 8, 8)}[preset]


def row_equal(fn, make, sizes=SIZES) -> dict:
    ref = fn(make([0]))
    out = {}
    for n in sizes:
        got = fn(make(list(range(n))))[:1]
        out[n] = "equal" if torch.equal(got, ref) else f"{float((got - ref).abs().max()):.2e}"
    # row 0 at each position of a batch of 8 (the others: rows 8..14)
    pos = []
    for p in range(8):
        rows = list(range(8, 15))
        rows.insert(p, 0)
        pos.append(torch.equal(fn(make(rows))[p:p + 1], ref))
    out["positions_equal"] = f"{sum(pos)}/8"
    return out


def origins(fn, make, n=16) -> dict:
    rep = compare_rows(fn, make([0]), make(list(range(n))))
    return {"ops": rep.ops, "first_difference": rep.first_difference, "sequence_break": rep.sequence_break,
            "origin_ops": rep.origin_ops(),
            "origin_shapes": sorted({f"{o.op} {o.shapes[:2]} vs {o.big_shapes[:2]}" for o in rep.origins})[:12]}


def probe(preset: str) -> dict:
    t0 = time.time()
    cfg, fam, pipe = tiny_pipeline(preset)  # sana_tiny: trained weights; the others: seeded random
    args, kw, batch = transformer_inputs(fam, pipe, cfg, 16)
    tr = fam.transformer(pipe)

    def tfn(a):
        return run_transformer(tr, *a)

    def tmake(rows):
        return take_rows((args, kw), rows, batch)

    vae = pipe.vae
    z = torch.randn(16, *latent_shape(preset), generator=torch.Generator().manual_seed(0))

    def vfn(x):
        with torch.inference_mode():
            return vae.decode(x, return_dict=False)[0]

    def vmake(rows):
        return z[torch.tensor(rows)].contiguous()

    res = {"preset": preset, "transformer": type(tr).__name__, "vae": type(vae).__name__,
           "captured_batch": batch}
    for mode in ("off", "on"):
        ctx = batch_invariant() if mode == "on" else None
        if ctx:
            ctx.install()
        try:
            res[f"transformer_{mode}"] = row_equal(tfn, tmake)
            res[f"transformer_origins_{mode}"] = origins(tfn, tmake)
            res[f"vae_{mode}"] = row_equal(vfn, vmake)
            res[f"vae_origins_{mode}"] = origins(vfn, vmake, n=8)
            if ctx:
                res["calls_on"] = dict(ctx.calls)
        finally:
            if ctx:
                ctx.remove()
    res["seconds"] = round(time.time() - t0, 1)
    print(json.dumps(res), flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--presets", nargs="*", default=PRESETS)
    a = ap.parse_args()
    results = []
    for p in a.presets:
        try:
            results.append(probe(p))
        except Exception as exc:  # noqa: BLE001 -- one family's failure is a row of the report
            results.append({"preset": p, "error": f"{type(exc).__name__}: {exc}"[:500]})
            print(json.dumps(results[-1]), flush=True)
    meta = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "cpu": platform.processor() or platform.machine(), "capability": torch.backends.cpu.get_cpu_capability()}
    Path(a.out).mkdir(parents=True, exist_ok=True)
    Path(a.out, "batch_invariance_cpu.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))


if __name__ == "__main__":
    main()
