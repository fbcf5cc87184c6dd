"""At one fixed batch size, does a row's output depend on its position or its neighbours? (issue 30)

The cheap form of "a sample is a function of its row" is to run every batch of a job at one shape
(`bcg.batch_sizes=[8]`: short batches are padded with dummy rows to 8). That holds only if, at a
fixed shape, the kernels compute each row the same way wherever it sits and whatever sits beside it.
This probe asks that of the default path (no batch-invariant mode) at SANA-1.6B size, random bf16
weights, component by component as the job runs them:

    text encoder   Gemma2-2B-shaped Gemma2Model on [8, 300] token ids (the job's bucket), masks of
                   varied length: SanaPipeline's prompt embeddings
    transformer    SanaTransformer2DModel (1.6B) one CFG call (16 rows: 8 negatives, then 8 positives),
                   eager, and with the lossless fusions (`bcg.fusions`, verified on first sight)
    decoder        DC-AE f32c32 `vae.decode` of [8, 32, S, S] latents

For each: item 0 placed at each of the 8 positions (its neighbours a rotation of items 1-7), item 0
beside 7 other items (8-14), and item 0 alone (batch 1, for reference). "equal" is bitwise.

    python benchmarks/probe_fixed_batch.py --out benchmarks/results            # CUDA, ~2 min
    python benchmarks/probe_fixed_batch.py --tiny --out /tmp/probe             # CPU smoke run
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_job_realsize import DC_AE_F32C32_SANA, GEMMA2_2B, randomize  # noqa: E402
from common import SANA_1600M, device_tag, environment, write_results  # noqa: E402

BATCH, TEXT = 8, 300
COLUMNS = ["component", "path", "resolution", "batch", "positions_equal", "neighbours_equal", "alone_equal",
           "max_abs_diff", "seconds"]


def compositions() -> dict:
    """Batches of item ids, each with item 0: at every position (beside items 1-7, rotated), beside
    other items, and alone."""
    out = {}
    for p in range(BATCH):
        rest = [1 + (p + i) % 7 for i in range(BATCH - 1)]
        out[f"pos{p}"] = rest[:p] + [0] + rest[p:]
    out["others"] = [0, 8, 9, 10, 11, 12, 13, 14]
    out["alone"] = [0]
    return out


def verdict(component: str, path: str, res: int, rows: dict, seconds: float) -> dict:
    """rows: composition -> item 0's output there."""
    ref = rows["pos0"]
    diffs = [(rows[k].float() - ref.float()).abs().max().item() for k in rows if k != "pos0"]
    return {"component": component, "path": path, "resolution": res, "batch": BATCH,
            "positions_equal": f"{sum(torch.equal(rows[f'pos{p}'], ref) for p in range(1, BATCH))}/{BATCH - 1}",
            "neighbours_equal": torch.equal(rows["others"], ref), "alone_equal": torch.equal(rows["alone"], ref),
            "max_abs_diff": max(diffs), "seconds": round(seconds, 1)}


def item_rows(fn, comps: dict, take) -> dict:
    """fn(items) -> the batch's output; take(out, position, n) -> item 0's rows in it."""
    with torch.no_grad():
        return {name: take(fn(items), items.index(0), len(items)) for name, items in comps.items()}


def probe_text(te, dev, g) -> dict:
    ids = torch.randint(0, te.config.vocab_size, (15, TEXT), generator=g, device=dev)
    mask = torch.zeros(15, TEXT, dtype=torch.int64, device=dev)
    for i in range(15):
        mask[i, : 5 + (i * 37) % 200] = 1

    def run(items):
        return te(input_ids=ids[items], attention_mask=mask[items])[0]

    return item_rows(run, compositions(), lambda out, p, n: out[p])


def probe_transformer(model, res: int, dev, g, dtype) -> dict:
    side = res // 32
    lat = torch.randn(15, 32, side, side, generator=g, device=dev).to(dtype)
    emb = torch.randn(2, 15, TEXT, 2304, generator=g, device=dev).to(dtype)  # [negative | positive]
    mask = torch.zeros(2, 15, TEXT, dtype=torch.int64, device=dev)
    for i in range(15):
        mask[0, i, :3] = 1
        mask[1, i, : 5 + (i * 37) % 200] = 1

    def run(items):
        n = len(items)
        return model(hidden_states=torch.cat([lat[items]] * 2), encoder_hidden_states=emb[:, items].flatten(0, 1),
                     encoder_attention_mask=mask[:, items].flatten(0, 1),
                     timestep=torch.full((2 * n,), 700.0, device=dev), return_dict=False)[0]

    return item_rows(run, compositions(), lambda out, p, n: torch.stack([out[p], out[n + p]]))


def probe_decoder(vae, res: int, dev, g, dtype) -> dict:
    side = res // 32
    z = torch.randn(15, 32, side, side, generator=g, device=dev).to(dtype)
    return item_rows(lambda items: vae.decode(z[items], return_dict=False)[0], compositions(),
                     lambda out, p, n: out[p])


def build(args, dev, dtype):
    from diffusers import AutoencoderDC, SanaTransformer2DModel
    from transformers import Gemma2Config, Gemma2Model

    tr, te, vae = dict(SANA_1600M), dict(GEMMA2_2B), dict(DC_AE_F32C32_SANA)
    if args.tiny:
        tr.update(num_layers=1, num_attention_heads=4, cross_attention_dim=128, num_cross_attention_heads=2,
                  cross_attention_head_dim=32)
        te.update(num_hidden_layers=1, hidden_size=64, intermediate_size=128, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=32)
        vae.update(decoder_block_out_channels=[8, 8, 16, 16, 32, 32], encoder_block_out_channels=[8, 8, 16, 16, 32, 32],
                   encoder_layers_per_block=[1] * 6, decoder_layers_per_block=[1] * 6, attention_head_dim=8)
    with torch.device(dev):
        models = (SanaTransformer2DModel(**tr), Gemma2Model(Gemma2Config(**te)), AutoencoderDC(**vae))
    for i, m in enumerate(models):
        m.to(dtype)
        randomize(m, seed=i, on_device=dev == "cuda")
        m.eval().requires_grad_(False)
    return models


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--resolutions", default="512,1024")
    ap.add_argument("--tiny", action="store_true", help="a few layers of each, on the CPU in fp32 (smoke run)")
    args = ap.parse_args()
    dev = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    dtype = torch.float32 if dev == "cpu" else torch.bfloat16
    g = torch.Generator(dev).manual_seed(0)
    transformer, te, vae = build(args, dev, dtype)
    rows = []

    def record(component, path, res, probe, *probe_args):
        t0 = time.perf_counter()
        rows.append(verdict(component, path, res, probe(*probe_args), time.perf_counter() - t0))
        print(rows[-1], flush=True)

    record("text encoder", "eager", 0, probe_text, te, dev, g)
    resolutions = [64] if args.tiny else [int(r) for r in args.resolutions.split(",")]
    for res in resolutions:
        record("transformer", "eager", res, probe_transformer, transformer, res, dev, g, dtype)
        record("decoder", "eager", res, probe_decoder, vae, res, dev, g, dtype)
    from bcg.fusions import install_fusions

    fx = install_fusions(transformer, backend="triton" if dev == "cuda" else "reference")
    for res in resolutions:
        record("transformer", "lossless fusions", res, probe_transformer, transformer, res, dev, g, dtype)
    stats = fx.stats()
    fx.remove()
    notes = [f"Item 0 at each of the {BATCH} positions of a batch of {BATCH} (neighbours: a rotation of items "
             "1-7), beside items 8-14, and alone; equal = bitwise, against position 0. max_abs_diff: over all "
             "compositions.", f"fusions: {stats.get('verified')} chains verified, {stats.get('rejected')} rejected, "
             f"{stats.get('forwards_verified')} forwards verified, {stats.get('forwards_rejected')} rejected",
             f"device {dev}, {dtype}; random weights normal_(0, 0.02) (bench_job_realsize.randomize)"]
    stem = f"fixed_batch_{device_tag()}" + ("_tiny" if args.tiny else "")
    write_results(args.out, stem, rows, COLUMNS, notes, environment())


if __name__ == "__main__":
    main()
