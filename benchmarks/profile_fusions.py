"""Where one forward's GPU time goes, eager vs lossless-fused (bcg/fusions) vs Inductor, by kernel
and by kind of kernel: SANA-1.6B (CFG, 2B rows) or Z-Image (6.15B, one call; benchmarks/bench_families.py's
model and inputs).

    python benchmarks/profile_fusions.py --res 1024 --batch 1 --top 15
    python benchmarks/profile_fusions.py --res 1024 --batch 1 --compile --out benchmarks/results
    python benchmarks/profile_fusions.py --family z_image --res 1024 --top 25

Prints, for each mode, total kernel ms per forward, kernel count, the top kernels by time (name,
calls, ms) and the time by kind (GEMM, convolution, attention, bcg's Triton kernels, Inductor's
Triton kernels, aten norms / reductions / elementwise, copies). One forward with CFG (2B rows),
after a warm-up forward (which verifies the fusions; with --compile, which compiles: ~40 s).
`--compile` adds `torch.compile` (default mode, so its kernels run launched one by one like the
other modes; kernel times do not depend on how they are launched): the kinds side by side say
where the lossless fused forward still spends more GPU time than Inductor's. `--out` writes the
tables as profile_fusions_<family>_<res>_b<batch>_<device>.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import build_sana, denoise_inputs  # noqa: E402
from kernel_kinds import kind_of  # noqa: E402

from bcg.fusions import install_fusions  # noqa: E402


def profile_forward(model, kw, top: int, call=None) -> dict:
    """One profiled forward: {"kernels", "ms", "top": [[name, calls, ms]], "kinds": {kind: [calls, ms]}}."""
    from torch.profiler import ProfilerActivity, profile

    call = call or (lambda: model(**kw))
    with torch.no_grad():
        call()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            call()
            torch.cuda.synchronize()
    agg: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            a = agg[e.name]
            a[0] += 1
            a[1] += e.device_time_total / 1e3
    kinds: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for name, (n, ms) in agg.items():
        k = kinds[kind_of(name)]
        k[0] += n
        k[1] += ms
    total = sum(v[1] for v in agg.values())
    count = sum(v[0] for v in agg.values())
    print(f"  kernels {count}, {total:.2f} ms per forward")
    ranked = sorted(agg.items(), key=lambda kv: -kv[1][1])
    for name, (n, ms) in ranked[:top]:
        print(f"  {ms:7.3f} ms {n:4d}x  {name[:110]}")
    print("  by kind:")
    for kind, (n, ms) in sorted(kinds.items(), key=lambda kv: -kv[1][1]):
        print(f"  {ms:7.3f} ms {n:4d}x  {kind}")
    return {"kernels": count, "ms": round(total, 3), "top": [[name, n, round(ms, 3)] for name, (n, ms) in ranked[:top]],
            "kinds": {kind: [n, round(ms, 3)] for kind, (n, ms) in kinds.items()}}


def print_kinds_side_by_side(results: dict) -> None:
    modes = list(results)
    kinds = sorted({k for r in results.values() for k in r["kinds"]},
                   key=lambda k: -max(r["kinds"].get(k, [0, 0.0])[1] for r in results.values()))
    print("== ms per forward by kind: " + " | ".join(modes))
    for k in kinds:
        print(f"  {k:20s} " + " | ".join(f"{results[m]['kinds'].get(k, [0, 0.0])[1]:8.3f}" for m in modes))
    print(f"  {'total':20s} " + " | ".join(f"{results[m]['ms']:8.3f}" for m in modes))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--res", type=int, default=1024)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--family", default="sana", choices=["sana", "z_image"])
    p.add_argument("--compile", action="store_true", help="also torch.compile (default mode) of the same forward")
    p.add_argument("--out", default="", help="a folder for the JSON (none: print only)")
    args = p.parse_args()
    compiled = None  # torch.compile's module, made last (--compile)
    if args.family == "z_image":
        import bench_families as bf

        model = bf.build("z_image", bf.REAL["z_image"], "cuda", torch.bfloat16)
        lat, step = bf.make_step("z_image", bf.REAL["z_image"], args.res // 8, "cuda", torch.bfloat16, tiny=False)
        t = torch.tensor(500.0, device="cuda")
        kw, call, compiled_call = None, (lambda: step(model, lat, t)), (lambda: step(compiled, lat, t))
    else:
        model = build_sana("cuda")
        inp = denoise_inputs(args.res, args.batch)
        x = torch.cat([inp["latents"]] * 2).to(torch.bfloat16)
        kw = dict(hidden_states=x, encoder_hidden_states=inp["encoder_hidden_states"],
                  encoder_attention_mask=inp["encoder_attention_mask"],
                  timestep=torch.full((x.shape[0],), 500.0, device="cuda", dtype=torch.bfloat16), return_dict=False)
        call, compiled_call = None, (lambda: compiled(**kw))
    where = f"{args.family} {args.res}² B{args.batch}"
    results = {}
    print(f"== eager {where}")
    results["eager"] = profile_forward(model, kw, args.top, call)
    fx = install_fusions(model, backend="triton")
    print(f"== fused {where}")
    results["fused"] = profile_forward(model, kw, args.top, call)
    s = fx.stats()
    results["fused"]["fusions"] = {k: s[k] for k in ("modules", "verified", "rejected", "fused_calls", "rejections")}
    print("  fusions:", results["fused"]["fusions"])
    fx.remove()
    if args.compile:
        compiled = torch.compile(model)
        print(f"== torch.compile (default mode) {where}")
        results["compile"] = profile_forward(compiled, kw, args.top, compiled_call)
    print_kinds_side_by_side(results)
    if args.out:
        from common import device_tag, environment

        name = f"profile_fusions_{args.family}_{args.res}_b{args.batch}_{device_tag()}.json"
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / name).write_text(json.dumps(
            {"environment": environment(), "command": "python " + " ".join(sys.argv), "modes": results}, indent=1))
        print("wrote", Path(args.out) / name)


if __name__ == "__main__":
    main()
