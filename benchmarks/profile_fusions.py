"""Where one forward's GPU time goes, eager vs lossless-fused (bcg/fusions), by kernel: SANA-1.6B
(CFG, 2B rows) or Z-Image (6.15B, one call; benchmarks/bench_families.py's model and inputs).

    python benchmarks/profile_fusions.py --res 1024 --batch 1 --top 15
    python benchmarks/profile_fusions.py --family z_image --res 1024 --top 25

Prints, for each mode, total kernel ms per forward, kernel count, and the top kernels by time
(name, calls, ms). One forward with CFG (2B rows), after a warm-up forward (which verifies).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import build_sana, denoise_inputs  # noqa: E402

from bcg.fusions import install_fusions  # noqa: E402


def profile_forward(model, kw, top: int, call=None) -> None:
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
    total = sum(v[1] for v in agg.values())
    print(f"  kernels {sum(v[0] for v in agg.values())}, {total:.2f} ms per forward")
    for name, (n, ms) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"  {ms:7.3f} ms {n:4d}x  {name[:110]}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--res", type=int, default=1024)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--family", default="sana", choices=["sana", "z_image"])
    args = p.parse_args()
    if args.family == "z_image":
        return profile_z_image(args)
    model = build_sana("cuda")
    inp = denoise_inputs(args.res, args.batch)
    x = torch.cat([inp["latents"]] * 2).to(torch.bfloat16)
    kw = dict(hidden_states=x, encoder_hidden_states=inp["encoder_hidden_states"],
              encoder_attention_mask=inp["encoder_attention_mask"],
              timestep=torch.full((x.shape[0],), 500.0, device="cuda", dtype=torch.bfloat16), return_dict=False)
    print(f"== eager {args.res}² B{args.batch}")
    profile_forward(model, kw, args.top)
    fx = install_fusions(model, backend="triton")
    print(f"== fused {args.res}² B{args.batch}")
    profile_forward(model, kw, args.top)
    s = fx.stats()
    print("  fusions:", {k: s[k] for k in ("verified", "rejected", "fused_calls", "rejections")})
    fx.remove()


def profile_z_image(args) -> None:
    import bench_families as bf

    model = bf.build("z_image", bf.REAL["z_image"], "cuda", torch.bfloat16)
    lat, step = bf.make_step("z_image", bf.REAL["z_image"], args.res // 8, "cuda", torch.bfloat16, tiny=False)
    t = torch.tensor(500.0, device="cuda")
    call = lambda: step(model, lat, t)  # noqa: E731
    print(f"== eager z_image {args.res}²")
    profile_forward(model, None, args.top, call)
    fx = install_fusions(model, backend="triton")
    print(f"== fused z_image {args.res}²")
    profile_forward(model, None, args.top, call)
    s = fx.stats()
    print("  fusions:", {k: s[k] for k in ("modules", "verified", "rejected", "fused_calls", "rejections")})
    fx.remove()


if __name__ == "__main__":
    main()
