"""Does this host's H.264 path give the same mp4 bytes for the same frames, and which part varies?

    python benchmarks/probe_mp4_repeat.py --out benchmarks/results

The same frames (seeded, smooth + noise, like decoded images) are encoded by several variants, each
several times in this process and once in each of several fresh processes:

- `sink`: sinks.video.encode_mp4 as the job runs it (rgb24 frames; PyAV converts them to yuv420p);
- `sws1-bitexact`: the RGB -> YUV conversion done first by swscale with one thread and the
  BITEXACT | ACCURATE_RND flags, then the encoder gets yuv420p frames (no conversion of its own);
- `numpy-yuv`: the conversion done in numpy (integer BT.601, limited range), yuv420p to the encoder;
- `numpy-yuv-asm0`: as numpy-yuv, with x264's assembly off (`x264-params asm=0`).

Then, as the sink runs them (a thread pool of sink.encode_threads), distinct clips encoded
concurrently are compared with their serial encodes.

A variant repeats itself when every encode gave one digest. Session 20 saw the H200 host give three
files for three encodes of the same frames in one process; this says whether the conversion or the
encoder is what varies. `--out DIR` writes DIR/probe_mp4_repeat.json.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VARIANTS = ("sink", "sws1-bitexact", "numpy-yuv", "numpy-yuv-asm0")


def frames(seed: int, n: int, h: int, w: int) -> np.ndarray:
    """Smooth colour fields that drift from frame to frame, plus a little noise: what a decoder would
    hand the sink, with motion for the encoder's inter frames."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(n + 8, h // 8 + 2, w // 8 + 2, 3)).cumsum(axis=0)
    out = []
    for i in range(n):
        small = base[i: i + 8].mean(axis=0)
        big = np.kron(small, np.ones((8, 8, 1)))[4: 4 + h, 4: 4 + w]
        img = 128 + 40 * big + rng.normal(scale=6, size=(h, w, 3))
        out.append(np.clip(img, 0, 255).astype(np.uint8))
    return np.stack(out)


def rgb_to_yuv420p(rgb: np.ndarray) -> tuple:
    """BT.601 limited range, integer arithmetic (the 8-bit fixed-point coefficients of Rec.601),
    chroma averaged over 2x2 blocks: the same numbers on every machine."""
    r, g, b = (rgb[..., c].astype(np.int32) for c in range(3))
    y = ((66 * r + 129 * g + 25 * b + 128) >> 8) + 16
    u = ((-38 * r - 74 * g + 112 * b + 128) >> 8) + 128
    v = ((112 * r - 94 * g - 18 * b + 128) >> 8) + 128

    def down(c):
        return (c[0::2, 0::2] + c[1::2, 0::2] + c[0::2, 1::2] + c[1::2, 1::2] + 2) >> 2

    return tuple(np.clip(p, 0, 255).astype(np.uint8) for p in (y, down(u), down(v)))


def yuv_frame(rgb: np.ndarray, how: str):
    import av
    from av.video.reformatter import Interpolation

    if how == "sws1-bitexact":
        src = av.VideoFrame.from_ndarray(rgb, format="rgb24")
        return src.reformat(format="yuv420p", threads=1,
                            interpolation=Interpolation.BILINEAR | Interpolation.BITEXACT | Interpolation.ACCURATE_RND)
    y, u, v = rgb_to_yuv420p(rgb)
    h, w = y.shape
    frame = av.VideoFrame(w, h, "yuv420p")
    for plane, data in zip(frame.planes, (y, u, v)):
        rows = np.frombuffer(plane, dtype=np.uint8).reshape(-1, plane.line_size)
        rows[: data.shape[0], : data.shape[1]] = data
    return frame


def encode(clip: np.ndarray, variant: str, fps: int = 16) -> bytes:
    import av

    from sinks.config import SinkConfig
    from sinks.video import Video, encode_mp4

    if variant == "sink":
        return encode_mp4(Video(clip, float(fps)), "mp4", SinkConfig())
    cfg = SinkConfig()
    out = io.BytesIO()
    with av.open(out, mode="w", format="mp4", options={"fflags": "+bitexact"}) as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height = clip.shape[2], clip.shape[1]
        stream.pix_fmt = "yuv420p"
        opts = {"crf": str(cfg.video_crf), "preset": cfg.video_preset, "threads": "1"}
        if variant.endswith("asm0"):
            opts["x264-params"] = "asm=0"
        stream.options = opts
        for i, rgb in enumerate(clip):
            frame = yuv_frame(rgb, "sws1-bitexact" if variant == "sws1-bitexact" else "numpy")
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


CLIPS = {"64x64x12": (64, 64, 12), "480x832x17": (480, 832, 17)}


def clips(files: list) -> dict:
    """The seeded clips, or the given .npy frame stacks ([F, H, W, 3] uint8: a job's frames)."""
    if files:
        return {Path(f).name: np.load(f) for f in files}
    return {name: frames(7, n, h, w) for name, (h, w, n) in CLIPS.items()}


def digests(repeats: int, files: list) -> dict:
    """{clip: {variant: [digest, ...]}} for `repeats` encodes each, in this process."""
    return {name: {v: [hashlib.sha256(encode(clip, v)).hexdigest()[:16] for _ in range(repeats)] for v in VARIANTS}
            for name, clip in clips(files).items()}


def pool_mismatches(workers: int, rounds: int) -> dict:
    """The sink encodes in a thread pool (sink.encode_threads): distinct 64x64 clips encoded
    concurrently, each compared with its serial encode."""
    from concurrent.futures import ThreadPoolExecutor

    clips = [frames(100 + i, 13, 64, 64) for i in range(2 * workers)]
    serial = [encode(c, "sink") for c in clips]
    bad = 0
    with ThreadPoolExecutor(workers) as pool:
        for _ in range(rounds):
            bad += sum(x != y for x, y in zip(serial, pool.map(lambda c: encode(c, "sink"), clips)))
    return {"workers": workers, "encodes": rounds * len(clips), "differing_from_serial": bad}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=4, help="encodes per variant in each process")
    ap.add_argument("--processes", type=int, default=3, help="fresh processes, each encoding --repeats times")
    ap.add_argument("--frames", nargs="*", default=[], help=".npy frame stacks to encode instead of the seeded clips")
    ap.add_argument("--no-pool", action="store_true", help="skip the thread-pool check")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(digests(args.repeats, args.frames)))
        return
    runs = [digests(args.repeats, args.frames)]
    for _ in range(args.processes):
        child = subprocess.run([sys.executable, __file__, "--child", "--repeats", str(args.repeats),
                                "--frames", *args.frames],
                               capture_output=True, text=True, check=True, env=dict(os.environ))
        runs.append(json.loads(child.stdout.strip().splitlines()[-1]))
    import av

    table = {}
    for clip in runs[0]:
        for v in VARIANTS:
            per_process = [sorted(set(r[clip][v])) for r in runs]
            every = {d for p in per_process for d in p}
            table[f"{clip} {v}"] = {"distinct_in_one_process": [len(p) for p in per_process],
                                   "distinct_overall": len(every)}
    pools = [] if args.no_pool else [pool_mismatches(w, 5) for w in (2, 8)]
    result = {"pools": pools, "host": platform.node(), "cpu": platform.processor() or platform.machine(),
              "cpus": os.cpu_count(),
              "av": av.__version__, "libs": {k: ".".join(map(str, v)) for k, v in av.library_versions.items()},
              "repeats": args.repeats, "processes": 1 + args.processes, "variants": table, "runs": runs}
    print(f"{'clip / variant':34} distinct per process   distinct overall")
    for k, row in table.items():
        print(f"{k:34} {str(row['distinct_in_one_process']):22} {row['distinct_overall']}")
    for p in pools:
        print(f"thread pool of {p['workers']}: {p['differing_from_serial']} of {p['encodes']} encodes "
              f"differ from serial")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "probe_mp4_repeat.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
