"""Shared pieces of the benchmarks: the SANA-1.6B-architecture model, denoise inputs, profiler
readings and result files. Run the scripts from the repository root (`python benchmarks/...`)."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

import torch

# Efficient-Large-Model/Sana_1600M_1024px_MultiLing_diffusers, transformer/config.json
# (also the diffusers defaults of SanaTransformer2DModel).
SANA_1600M = dict(
    in_channels=32, out_channels=32, num_attention_heads=70, attention_head_dim=32, num_layers=20,
    num_cross_attention_heads=20, cross_attention_head_dim=112, cross_attention_dim=2240,
    caption_channels=2304, mlp_ratio=2.5, attention_bias=False, sample_size=32, patch_size=1,
    norm_elementwise_affine=False, norm_eps=1e-6,
)
VAE_FACTOR = 32  # DC-AE f32c32: 512^2 -> 16x16 latents, 1024^2 -> 32x32
TEXT_LEN, REAL_TOKENS = 300, 47


def build_sana(device: str = "cuda", dtype: torch.dtype = torch.bfloat16, seed: int = 0, **overrides):
    """SanaTransformer2DModel with the 1.6B architecture and random weights (seeded)."""
    from diffusers import SanaTransformer2DModel

    torch.manual_seed(seed)
    with torch.device(device):
        model = SanaTransformer2DModel(**{**SANA_1600M, **overrides})
    return model.to(dtype).eval().requires_grad_(False)


def denoise_inputs(resolution: int, batch: int, device="cuda", dtype=torch.bfloat16, seed: int = 0,
                   text_len: int = TEXT_LEN, real_tokens: int = REAL_TOKENS) -> dict:
    """Latents (B), prompt embeddings and masks for CFG (2B: negative then positive)."""
    g = torch.Generator(device).manual_seed(seed)
    side = resolution // VAE_FACTOR
    latents = torch.randn(batch, 32, side, side, generator=g, device=device, dtype=torch.float32)
    emb = torch.randn(2 * batch, text_len, 2304, generator=g, device=device, dtype=dtype)
    mask = torch.zeros(2 * batch, text_len, dtype=torch.int64, device=device)
    mask[:, :real_tokens] = 1
    return {"latents": latents, "encoder_hidden_states": emb, "encoder_attention_mask": mask}


def flow_schedule(steps: int = 20, shift: float = 3.0, device="cuda"):
    """Timesteps and sigmas of diffusers' FlowMatchEulerDiscreteScheduler."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    sched = FlowMatchEulerDiscreteScheduler(shift=shift)
    sched.set_timesteps(steps, device=device)
    return sched.timesteps, [float(s) for s in sched.sigmas]


TINY = dict(num_layers=1, num_attention_heads=4, cross_attention_dim=128, num_cross_attention_heads=2,
            cross_attention_head_dim=32)  # --tiny: a CPU smoke test of the scripts themselves


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class LoopTimer:
    """Milliseconds of one loop: CUDA events on the GPU, the wall clock on the CPU."""

    def __init__(self) -> None:
        self.cuda = torch.cuda.is_available()

    def __enter__(self):
        sync()
        if self.cuda:
            self.start, self.end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            self.start.record()
        else:
            self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            self.end.record()
            self.end.synchronize()
            self.ms = self.start.elapsed_time(self.end)
        else:
            self.ms = (time.perf_counter() - self.t0) * 1e3


def kernel_profile(fn, steps: int) -> dict:
    """Run `fn` once under the profiler: GPU kernel time and host launches per step."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    sync()
    with profile(activities=acts) as prof:
        fn()
        sync()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    kernel_us = memcpy_us = 0.0
    kernels = launches = graph_launches = 0
    for e in events:
        cat, name = e.get("cat", ""), e.get("name", "")
        if cat == "kernel":
            kernel_us += e.get("dur", 0)
            kernels += 1
        elif cat in ("gpu_memcpy", "gpu_memset"):
            memcpy_us += e.get("dur", 0)
        elif cat == "cuda_runtime" or cat == "cuda_driver":
            if name.startswith(("cudaLaunchKernel", "cuLaunchKernel")):
                launches += 1
            elif name.startswith(("cudaGraphLaunch", "cuGraphLaunch")):
                graph_launches += 1
    return {
        "gpu_kernel_ms": round((kernel_us + memcpy_us) / 1e3, 3),
        "gpu_kernels_only_ms": round(kernel_us / 1e3, 3),
        "kernels_per_step": round(kernels / steps, 1),
        "kernel_launches_per_step": round(launches / steps, 1),
        "graph_launches_per_step": round(graph_launches / steps, 1),
        "host_launches_per_step": round((launches + graph_launches) / steps, 1),
    }


def timed(fn, reps: int, warm: int = 2) -> list[float]:
    """ms of each of `reps` calls of fn (CUDA events on the GPU, the wall clock on the CPU)."""
    for _ in range(warm):
        fn()
    out = []
    for _ in range(reps):
        if torch.cuda.is_available():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def back_to_back_us(fn, iters: int) -> float:
    """us a call on the GPU: the median of five CUDA-event timings of `iters` back-to-back calls
    (launch overhead included where a call is shorter than its launch)."""
    import statistics

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1000 / iters)
    return round(statistics.median(times), 2)


def graph_ms(fn) -> float:
    """GPU ms of one call of fn replayed in a CUDA graph (as bcg replays the denoiser), the median of
    Triton's reps: no launch overhead, which for a Triton launch (~40 us of Python) would swamp a
    small GEMM's 10-30 us."""
    import triton.testing

    return float(triton.testing.do_bench_cudagraph(fn, rep=25))


def environment() -> dict:
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }


def commit() -> str:
    """The commit a result measured: $BENCH_COMMIT where it is set, else this checkout's HEAD. A device
    call copies the checkout's files, and the copy's git history can be stale (load_h200_s43 first named
    the previous HEAD for a tree one patch series ahead of it), so a call script sets BENCH_COMMIT."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).resolve().parent,
                              capture_output=True, text=True, check=True).stdout.strip() or "unknown"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def device_tag() -> str:
    if not torch.cuda.is_available():
        return "cpu"
    name = torch.cuda.get_device_name().lower()
    return "h200" if "h200" in name else name.replace("nvidia", "").strip().replace(" ", "_")


def write_results(out_dir: str, stem: str, rows: list[dict], columns: list[str], notes: list[str],
                  meta: dict) -> tuple[Path, Path]:
    """`<stem>.json` (meta + rows) and `<stem>.md` (the command, date, a table, notes)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    jpath, mpath = out / f"{stem}.json", out / f"{stem}.md"
    jpath.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [f"# {stem}", "", f"- date: {meta['date']}", f"- gpu: {meta['gpu']}, torch {meta['torch']}"
             f" (CUDA {meta['cuda']})", f"- command: `{meta['command']}`", ""]
    lines.append("| " + " | ".join(columns) + " |")
    lines.append("|" + "---|" * len(columns))
    for r in rows:
        lines.append("| " + " | ".join(_cell(r.get(c)) for c in columns) + " |")
    lines += [""] + [f"- {n}" for n in notes]
    mpath.write_text("\n".join(lines) + "\n")
    return jpath, mpath


def _cell(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1e-2 and v != 0 else f"{v:,.2f}".rstrip("0").rstrip(".")
    return str(v)
