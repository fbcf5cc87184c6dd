"""GPU: where SANA's DC-AE decode spends its time, and which faster decodes keep its bytes (issue 28).

The job decodes every batch through diffusers' `AutoencoderDC` (dc-ae-f32c32-sana-1.0's config,
random bf16 weights as `bench_job_realsize.py` builds them). At 1024², batch 8, the decode was 30 of
the job's 168 GPU-seconds (`results/job_realsize_1024_h200_s22.md`): after the denoiser, the largest
cost of an image, and eager. This probe says where that time goes before any kernel is written:

- the eager decode: median, min and max ms of `--reps` calls (CUDA events);
- its GPU time by kind of kernel and its heaviest kernels (one profiled call);
- time by stage of the decoder (conv_in, each up block, the output head), and per op inside the
  first block of each ResBlock stage and each up-sampling block;
- other ways to run the same decode, each timed and compared with eager byte for byte: a CUDA graph
  replay, channels_last weights and input, `cudnn.benchmark`, bcg's lossless fusions (the DC-AE rules of
  bcg/fusions/dc_ae.py, as the job installs them), and (`--compile`) `torch.compile` of the decoder,
  which is not lossless and is here only as the bound a fusion could reach.

    python benchmarks/probe_vae_decode.py --out benchmarks/results --configs 1024x8,512x8 --compile

`--invariant-profile` runs only this (issue 30: the decode's extra time under `bcg.invariant`): the decode as the job
runs it (the lossless tier installed where CUDA is) without and with the batch-invariant mode, each installed and
verified on first sight in its own mode, then timed and profiled by kind of kernel and heaviest kernels.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_job_realsize import DC_AE_F32C32_SANA  # noqa: E402
from common import device_tag, environment, timed, write_results  # noqa: E402
from kernel_kinds import kind_of  # noqa: E402


def build_vae(device: str):
    from diffusers import AutoencoderDC

    torch.manual_seed(0)
    vae = AutoencoderDC(**DC_AE_F32C32_SANA).to(device=device, dtype=torch.bfloat16).eval()
    g = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():  # bench_job_realsize.randomize's rule: normal_(0, 0.02) for dim >= 2, biases zero
        for name, p in vae.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g, device=device).mul_(0.02).to(p.dtype))
            elif name.endswith("bias"):
                p.zero_()
    return vae


def med(ts: list[float]) -> float:
    return round(statistics.median(ts), 3)


def kinds(fn, n: int = 12) -> tuple[dict, list]:
    """GPU ms by kind of kernel and the n heaviest kernels of one call of fn."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    by_kind: dict = {}
    by_name: dict = {}
    for e in prof.events():
        if e.device_type.name != "CUDA":
            continue
        us = e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        by_kind[kind_of(e.name)] = by_kind.get(kind_of(e.name), 0.0) + us / 1e3
        ms, c = by_name.get(e.name, (0.0, 0))
        by_name[e.name] = (ms + us / 1e3, c + 1)
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:n]
    return ({k: round(v, 2) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
            [(name[:90], round(ms, 2), calls) for name, (ms, calls) in top])


def layout(t: torch.Tensor) -> str:
    return "channels-last" if t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous() \
        else "NCHW" if t.is_contiguous() else f"strides {t.stride()}"


def stage_times(dec, z: torch.Tensor, reps: int) -> list[tuple[str, float]]:
    """Decoder.forward cut into its stages (diffusers 0.42's order), each timed on its real input."""
    steps = []

    def conv_in(h):
        if dec.in_shortcut:
            x = h.repeat_interleave(dec.in_shortcut_repeats, dim=1, output_size=h.shape[1] * dec.in_shortcut_repeats)
            return dec.conv_in(h) + x
        return dec.conv_in(h)

    steps.append(("conv_in", conv_in))
    for i, blk in reversed(list(enumerate(dec.up_blocks))):
        steps.append((f"up_blocks[{i}] ({type(blk[-1]).__name__} x{sum(1 for m in blk if 'Block' in type(m).__name__)})",
                      blk))
    steps.append(("norm_out + act + conv_out",
                  lambda h: dec.conv_out(dec.conv_act(dec.norm_out(h.movedim(1, -1)).movedim(-1, 1)))))
    out, h = [], z
    for name, fn in steps:
        x = h
        out.append((f"{name} {tuple(x.shape[1:])} {layout(x)}", med(timed(lambda: fn(x), reps))))
        h = fn(x)
    return out


def resblock_ops(blk, x: torch.Tensor, reps: int) -> list[tuple[str, float]]:
    h1 = blk.conv1(x)
    h2 = blk.nonlinearity(h1)
    h3 = blk.conv2(h2)
    h4 = blk.norm(h3.movedim(1, -1)).movedim(-1, 1)
    return [("conv1 (3x3, bias)", med(timed(lambda: blk.conv1(x), reps))),
            ("SiLU", med(timed(lambda: blk.nonlinearity(h1), reps))),
            ("conv2 (3x3)", med(timed(lambda: blk.conv2(h2), reps))),
            ("RMSNorm over channels (movedim, 7 aten ops)", med(timed(lambda: blk.norm(h3.movedim(1, -1)).movedim(-1, 1), reps))),
            ("residual add", med(timed(lambda: h4 + x, reps)))]


def upblock_ops(blk, x: torch.Tensor, reps: int) -> list[tuple[str, float]]:
    up = F.interpolate(x, scale_factor=blk.factor, mode=blk.interpolation_mode)
    y = F.pixel_shuffle(x.repeat_interleave(blk.repeats, dim=1, output_size=x.shape[1] * blk.repeats), blk.factor)
    c = blk.conv(up)
    return [("interpolate (nearest x2)", med(timed(lambda: F.interpolate(x, scale_factor=blk.factor,
                                                                          mode=blk.interpolation_mode), reps))),
            ("conv (3x3, bias)", med(timed(lambda: blk.conv(up), reps))),
            ("shortcut: repeat_interleave + pixel_shuffle",
             med(timed(lambda: F.pixel_shuffle(x.repeat_interleave(blk.repeats, dim=1,
                                                                   output_size=x.shape[1] * blk.repeats),
                                               blk.factor), reps))),
            ("add", med(timed(lambda: c + y, reps)))]


def op_rows(dec, z: torch.Tensor, reps: int) -> list[tuple[str, float]]:
    from diffusers.models.autoencoders.autoencoder_dc import DCUpBlock2d, ResBlock

    seen, rows = set(), []
    hooks = []
    inputs: dict = {}

    def grab(mod, args):
        inputs.setdefault(id(mod), args[0])

    for m in dec.modules():
        if isinstance(m, (ResBlock, DCUpBlock2d)):
            hooks.append(m.register_forward_pre_hook(grab))
    dec(z)
    for h in hooks:
        h.remove()
    for m in dec.modules():
        x = inputs.get(id(m))
        if x is None:
            continue
        key = (type(m).__name__, f"{tuple(x.shape[1:])} {layout(x)}")
        if key in seen:
            continue
        seen.add(key)
        ops = resblock_ops(m, x, reps) if isinstance(m, ResBlock) else upblock_ops(m, x, reps) if m.interpolate else []
        rows += [(f"{key[0]} {key[1]}: {name}", ms) for name, ms in ops]
    return rows


def variants(vae, z: torch.Tensor, reps: int, compile_too: bool) -> list[dict]:
    decode = lambda v, x: v.decode(x, return_dict=False)[0]  # noqa: E731
    want = decode(vae, z)
    rows = []

    def row(name, fn, note=""):
        t0 = time.perf_counter()
        got = fn()
        setup = time.perf_counter() - t0
        ts = timed(fn, reps)
        rows.append(dict(variant=name, ms=med(ts), ms_min=round(min(ts), 3), ms_max=round(max(ts), 3),
                         bytes_equal=bool(torch.equal(got, want)),
                         max_abs_diff=float((got.float() - want.float()).abs().max()), setup_s=round(setup, 2),
                         note=note))

    row("eager", lambda: decode(vae, z))
    if torch.cuda.is_available():
        static = z.clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                decode(vae, static)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = decode(vae, static)

        def replay():
            static.copy_(z)
            graph.replay()
            return out

        row("CUDA graph replay", replay)
        del graph, out
        torch.backends.cudnn.benchmark = True
        row("cudnn.benchmark", lambda: decode(vae, z), "cuDNN picks its algorithm by timing")
        torch.backends.cudnn.benchmark = False
    cl = copy.deepcopy(vae).to(memory_format=torch.channels_last)
    zc = z.contiguous(memory_format=torch.channels_last)
    row("channels_last", lambda: decode(cl, zc).contiguous())
    del cl
    if torch.cuda.is_available():
        from bcg.fusions import install_fusions

        fv = copy.deepcopy(vae)
        fx = install_fusions(fv)  # the lossless tier's DC-AE rules (bcg/fusions/dc_ae.py), as the job installs them
        row("bcg lossless fusions", lambda: decode(fv, z),
            f"{fx.stats()['modules']} blocks; setup_s is the first call, which verifies against eager")
        rows[-1]["note"] += f"; verified {fx.counters.verified}, rejected {fx.counters.rejected}, " \
                            f"forwards {fx.counters.forwards_verified}/{fx.counters.forwards_rejected}"
        del fv
    if compile_too:
        cv = copy.deepcopy(vae)
        cv.decoder = torch.compile(cv.decoder)
        row("torch.compile(decoder)", lambda: decode(cv, z), "not lossless: the bound a fusion could reach")
        del cv
    return rows


def fused_profile_rows(vae, z: torch.Tensor, case: str, reps: int) -> list[dict]:
    """What the lossless tier leaves: the fused decode's GPU time by kind, its heaviest kernels and its stages."""
    from bcg.fusions import install_fusions

    fv = copy.deepcopy(vae)
    install_fusions(fv)
    fv.decode(z, return_dict=False)  # the first call verifies every chain against eager
    by_kind, top = kinds(lambda: fv.decode(z, return_dict=False)[0], n=30)
    total = sum(by_kind.values())
    rows = [dict(case=case, part="fused kind", name=k, ms=ms, note=f"{100 * ms / total:.1f}% of {total:.1f} GPU ms")
            for k, ms in by_kind.items()]
    rows += [dict(case=case, part="fused kernel", name=name, ms=ms, note=f"{calls} calls") for name, ms, calls in top]
    rows += [dict(case=case, part="fused stage", name=name, ms=ms) for name, ms in stage_times(fv.decoder, z, reps)]
    return rows


def invariant_profile_rows(vae, z: torch.Tensor, case: str, reps: int) -> list[dict]:
    """The job's decode without and with bcg.invariant: its time, GPU time by kind and heaviest kernels."""
    from bcg.fusions import install_fusions
    from bcg.invariant import batch_invariant

    rows: list[dict] = []
    for mode in ("default", "invariant"):
        with batch_invariant() if mode == "invariant" else contextlib.nullcontext():
            dv = copy.deepcopy(vae)
            fused = install_fusions(dv) if torch.cuda.is_available() else None  # the tier is CUDA's

            def decode():
                return dv.decode(z, return_dict=False)[0]

            decode()  # first sight: with the tier, every chain verified against this mode's own eager
            ts = timed(decode, reps)
            by_kind, top = kinds(decode, n=20)
        total = sum(by_kind.values())
        what = f"{fused.stats()['modules']} fused blocks" if fused is not None else "eager (no CUDA: no tier)"
        rows.append(dict(case=case, part=f"{mode} decode", name=what, ms=med(ts), ms_min=round(min(ts), 3),
                         ms_max=round(max(ts), 3), note=f"{total:.1f} GPU ms in the profiled call"))
        rows += [dict(case=case, part=f"{mode} kind", name=k, ms=ms, note=f"{100 * ms / total:.1f}% of {total:.1f}")
                 for k, ms in by_kind.items()]
        rows += [dict(case=case, part=f"{mode} kernel", name=name, ms=ms, note=f"{calls} calls")
                 for name, ms, calls in top]
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--configs", default="1024x8,512x8", help="RESxBATCH,... (latents RES/32)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--compile", action="store_true", help="also time torch.compile(decoder)")
    p.add_argument("--tag", default="")
    p.add_argument("--invariant-profile", action="store_true",
                   help="only the decode as the job runs it, without and with bcg.invariant (see the docstring)")
    p.add_argument("--fused-profile", action="store_true",
                   help="also profile the fused decode (kinds, heaviest kernels, stages): what the tier leaves")
    a = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    vae = build_vae(device)
    rows, notes = [], []
    with torch.no_grad():
        for cfg in a.configs.split(","):
            res, batch = (int(v) for v in cfg.split("x"))
            z = torch.randn(batch, 32, res // 32, res // 32, generator=torch.Generator(device=device).manual_seed(1),
                            device=device, dtype=torch.bfloat16)
            case = f"{res}² B{batch}"
            if a.invariant_profile:
                rows += invariant_profile_rows(vae, z, case, a.reps)
                continue
            for v in variants(vae, z, a.reps, a.compile):
                rows.append(dict(case=case, part="variant", name=v.pop("variant"), **v))
            by_kind, top = kinds(lambda: vae.decode(z, return_dict=False)[0])
            total = sum(by_kind.values())
            for k, ms in by_kind.items():
                rows.append(dict(case=case, part="kind", name=k, ms=ms, note=f"{100 * ms / total:.1f}% of {total:.1f} GPU ms"))
            for name, ms, calls in top:
                rows.append(dict(case=case, part="kernel", name=name, ms=ms, note=f"{calls} calls"))
            for name, ms in stage_times(vae.decoder, z, a.reps):
                rows.append(dict(case=case, part="stage", name=name, ms=ms))
            for name, ms in op_rows(vae.decoder, z, a.reps):
                rows.append(dict(case=case, part="op", name=name, ms=ms))
            if a.fused_profile and torch.cuda.is_available():
                rows += fused_profile_rows(vae, z, case, a.reps)
            del z
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    if a.invariant_profile:
        notes.append("--invariant-profile: '<mode> decode' is the median of --reps calls after the first (which installs "
                     "and verifies); kind/kernel rows are one profiled call in that mode")
    notes.append("variant rows: bytes_equal compares the decoded tensor with the eager decode of the same latents")
    notes.append("fused rows (--fused-profile): the same for the decode with the lossless tier installed")
    notes.append("kind/kernel rows: one profiled eager call; stage/op rows: median of --reps calls, each op on its real input")
    cols = ["case", "part", "name", "ms", "ms_min", "ms_max", "bytes_equal", "max_abs_diff", "setup_s", "note"]
    stem = f"vae_decode_{device_tag()}" + (f"_{a.tag}" if a.tag else "")
    j, m = write_results(a.out, stem, rows, cols, notes, environment())
    print(m.read_text())


if __name__ == "__main__":
    main()
