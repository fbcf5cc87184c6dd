"""Where a row's bytes depend on its batch, on the CPU: tiny presets, op by op (issue 30).

For each family: the transformer inputs of one real pipeline call for 16 rows (CFG doubles them),
cut to batch 1, 2, 3, 8, 16; is row 0's output the same bytes? Then, op by op (bcg.invariant.trace),
which aten ops compute row 0 differently at batch 16 than at batch 1 (the *origins*). The same for
the family's VAE decode on random latents. Mode off, then on (bcg.invariant). Z-Image also: a row
beside rows of longer captions (its transformer pads a batch to the longest).

    python benchmarks/probe_batch_invariance.py --out benchmarks/results     # ~25 min on 2 cores
    python benchmarks/probe_batch_invariance.py --presets z_image_tiny --merge  # re-measure some, keep the rest

`--realsize DIR` adds the row `sana_1600m` at SANA-1.6B size: the folder `bench_job_realsize.py build`
writes (the published configs, random weights), its transformer and DC-AE in float32 on random inputs
(no text encoder: Gemma2-2B over 16 prompts would take minutes here), rows only, no op trace:

    python benchmarks/probe_batch_invariance.py --presets --realsize /tmp/sana16 --merge   # ~10 min
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

from common import commit  # noqa: E402 (benchmarks/, this script's folder, is sys.path[0])

from bcg.invariant import InvariantConfig, batch_invariant, compare_rows  # noqa: E402
from tests.helpers import tiny_pipeline  # noqa: E402
from tests.invariance_rows import PROMPTS, run_transformer, take_rows, transformer_inputs  # noqa: E402

PRESETS = ["sana_tiny", "flux_tiny", "qwen_image_tiny", "wan_tiny", "z_image_tiny", "longcat_image_tiny",
           "sana_video_tiny", "ltx2_tiny", "glm_image_tiny", "minimax_h3_tiny"]
SIZES = (2, 3, 8, 16)


def latent_shape(preset: str):
    return {"sana_tiny": (8, 16, 16), "flux_tiny": (4, 16, 16), "z_image_tiny": (4, 16, 16),
            "longcat_image_tiny": (16, 16, 16), "qwen_image_tiny": (4, 1, 16, 16), "wan_tiny": (16, 3, 8, 8),
            "sana_video_tiny": (16, 3, 8, 8), "ltx2_tiny": (8, 3, 8, 8), "glm_image_tiny": (4, 8, 8),
            "minimax_h3_tiny": (4, 5, 4, 4)}[preset]


def decoders(preset: str, pipe) -> list:
    """[(json key, module, decode fn, one row's latent shape)]: the VAE, and the families' other decoder
    calls (LTX-2: the audio VAE to a mel spectrogram, then the vocoder; MiniMax-H3: the audio VAE), each
    on random latents of the shape the tiny preset's pipeline hands it (MiniMax-H3: one 17-frame video
    chunk, 8 audio latents, not the whole 5 s clip: the trace clones every op's tensors)."""
    vae = pipe.vae
    if preset == "ltx2_tiny":  # decode(z, temb): no timestep conditioning in the tiny VAE
        out = [("vae", vae, lambda x: vae.decode(x, None, return_dict=False)[0], latent_shape(preset))]
    else:
        out = [("vae", vae, lambda x: vae.decode(x, return_dict=False)[0], latent_shape(preset))]
    if preset == "ltx2_tiny":
        out += [("audio_vae", pipe.audio_vae, lambda x: pipe.audio_vae.decode(x, return_dict=False)[0], (2, 14, 2)),
                ("vocoder", pipe.vocoder, lambda x: pipe.vocoder(x), (2, 53, 8))]
    if preset == "minimax_h3_tiny":  # [rows x audio channels, latent channels, latents]
        out += [("audio_vae", pipe.audio_vae, lambda x: pipe.audio_vae.decode(x, return_dict=False)[0], (4, 8))]
    return out


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


def by_mode(res: dict, parts: list, trace: bool) -> None:
    """Into `res`, for each part (key, fn, make, rows traced): its rows with the mode off, then on (`row_equal`)
    and, with `trace`, the ops that compute its row 0 differently (`origins`); the mode's call counts as
    calls_on."""
    for mode in ("off", "on"):
        ctx = batch_invariant() if mode == "on" else None
        if ctx:
            ctx.install()
        try:
            for key, fn, make, n in parts:
                res[f"{key}_{mode}"] = row_equal(fn, make)
                if trace:
                    res[f"{key}_origins_{mode}"] = origins(fn, make, n=n)
            if ctx:
                res["calls_on"] = dict(ctx.calls)
        finally:
            if ctx:
                ctx.remove()


def caption_neighbours(fam, pipe, cfg) -> dict:
    """Z-Image: each row (short, 229- and 512-token captions, CFG's negatives) alone against the
    same row in batches of those rows; mode off, on without its attention replacement, on."""
    long = ["a long prompt about " + " ".join(["a quiet red fox by a misty lake at dawn"] * n) for n in (20, 60)]
    args, kw, batch = transformer_inputs(fam, pipe, cfg, 3, prompts=[PROMPTS[0], *long])
    tr = fam.transformer(pipe)
    out = {"caption_lengths": [len(c) for c in args[2]]}
    for name, ctx in (("off", None), ("on_without_attention", InvariantConfig(attention_cpu=False)),
                      ("on", InvariantConfig())):
        inv = batch_invariant(ctx).install() if ctx else None
        try:
            alone = {r: run_transformer(tr, *take_rows((args, kw), [r], batch)) for r in range(batch)}
            bad = []
            for rows in ([0, 2], [2, 1], [1, 0, 2], [5, 4, 3, 2, 1, 0]):
                got = run_transformer(tr, *take_rows((args, kw), rows, batch))
                bad += [f"row {r} at {i} of {rows}: {float((got[i:i + 1] - alone[r]).abs().max()):.1e}"
                        for i, r in enumerate(rows) if not torch.equal(got[i:i + 1], alone[r])]
            out[name] = bad or "equal"
        finally:
            if inv:
                inv.remove()
    return out


def probe(preset: str) -> dict:
    t0 = time.time()
    cfg, fam, pipe = tiny_pipeline(preset)  # sana_tiny: trained weights; the others: seeded random
    args, kw, batch = transformer_inputs(fam, pipe, cfg, 16)
    tr = fam.transformer(pipe)

    def tfn(a):
        return run_transformer(tr, *a)

    def tmake(rows):
        return take_rows((args, kw), rows, batch)

    decs = []
    for key, module, dec, shape in decoders(preset, pipe):
        z = torch.randn(16, *shape, generator=torch.Generator().manual_seed(0))

        def vfn(x, dec=dec):
            with torch.inference_mode():
                return dec(x)

        def vmake(rows, z=z):
            return z[torch.tensor(rows)].contiguous()

        decs.append((key, type(module).__name__, vfn, vmake))

    res = {"preset": preset, "transformer": type(tr).__name__, **{k: name for k, name, _, _ in decs},
           "captured_batch": batch}
    by_mode(res, [("transformer", tfn, tmake, 16), *((key, vfn, vmake, 8) for key, _, vfn, vmake in decs)],
            trace=True)
    if preset == "z_image_tiny":
        res["caption_neighbours"] = caption_neighbours(fam, pipe, cfg)
    res["seconds"] = round(time.time() - t0, 1)
    print(json.dumps(res), flush=True)
    return res


def probe_realsize(folder: Path, side: int = 4, text: int = 64) -> dict:
    """SANA-1.6B size on the CPU, float32: the transformer's rows at 128² (`side` x `side` latents) against
    random caption embeddings of `text` tokens with masked tails of random length (as the bucketed text),
    and the DC-AE decode of random latents; each row alone against batches of 2, 3, 8 and 16 and at the 8
    positions of a batch of 8, mode off and on. The op trace (`origins`) is left out: it clones every op's
    tensors, 6 GB of weights' worth of GEMMs at this size."""
    from diffusers import AutoencoderDC, SanaTransformer2DModel

    t0 = time.time()
    tr = SanaTransformer2DModel.from_pretrained(folder / "transformer", torch_dtype=torch.float32).eval()
    vae = AutoencoderDC.from_pretrained(folder / "vae", torch_dtype=torch.float32).eval()
    g, n = torch.Generator().manual_seed(0), 16
    mask = torch.ones(n, text, dtype=torch.long)
    for i, keep in enumerate(torch.randint(8, text + 1, (n,), generator=g).tolist()):
        mask[i, keep:] = 0
    inputs = {"hidden_states": torch.randn(n, tr.config.in_channels, side, side, generator=g),
              "encoder_hidden_states": torch.randn(n, text, tr.config.caption_channels, generator=g),
              "encoder_attention_mask": mask, "timestep": torch.linspace(100.0, 900.0, n)}
    z = torch.randn(n, vae.config.latent_channels, side, side, generator=g)

    def tfn(kw):
        with torch.inference_mode():
            return tr(**kw, return_dict=False)[0]

    def vfn(x):
        with torch.inference_mode():
            return vae.decode(x, return_dict=False)[0]

    def tmake(rows):
        return {k: v[torch.tensor(rows)].contiguous() for k, v in inputs.items()}

    def vmake(rows):
        return z[torch.tensor(rows)].contiguous()

    res = {"preset": "sana_1600m", "transformer": type(tr).__name__, "vae": type(vae).__name__,
           "folder": str(folder), "dtype": "float32", "latents": [side, side], "text_tokens": text}
    by_mode(res, [("transformer", tfn, tmake, 16), ("vae", vfn, vmake, 8)], trace=False)
    res["seconds"] = round(time.time() - t0, 1)
    print(json.dumps(res), flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--presets", nargs="*", default=PRESETS)
    ap.add_argument("--merge", action="store_true",
                    help="keep the existing json's rows of the presets not run now (each new row says when it ran)")
    ap.add_argument("--realsize", type=Path, default=None, metavar="DIR",
                    help="also the row sana_1600m: a SANA-1.6B-size folder (bench_job_realsize.py build)")
    a = ap.parse_args()
    results = [probe_realsize(a.realsize)] if a.realsize else []
    for p in a.presets:
        try:
            results.append(probe(p))
        except Exception as exc:  # noqa: BLE001 -- one family's failure is a row of the report
            results.append({"preset": p, "error": f"{type(exc).__name__}: {exc}"[:500]})
            print(json.dumps(results[-1]), flush=True)
    meta = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "cpu": platform.processor() or platform.machine(), "cpu_model": _cpu_model(),
            "capability": torch.backends.cpu.get_cpu_capability(),
            "commit": commit(), "command": " ".join(["python", *sys.argv])}
    path = Path(a.out, "batch_invariance_cpu.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    if a.merge and path.exists():
        old = json.loads(path.read_text())
        for r in results:
            r["measured"] = meta
        fresh = {r["preset"]: r for r in results}
        kept = [fresh.pop(r["preset"], r) for r in old["results"]]
        results, meta = kept + list(fresh.values()), old["meta"]
    path.write_text(json.dumps({"meta": meta, "results": results}, indent=1))


def _cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "unknown"
    return next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "unknown")


if __name__ == "__main__":
    main()
