"""Where a process's time went: a py-spy raw profile (`py-spy record --format raw --idle`) as a tree.

    python benchmarks/pyspy_tree.py run.pyspy [--thread MainThread] [--min 1.0] [--depth 40] [--rate 50]
    python benchmarks/pyspy_tree.py run.speedscope.json [--from 0] [--until 30]     (--format speedscope)

A speedscope profile keeps the samples in time order, so --from/--until (seconds from the start
of sampling) show one stretch of the run: the first batch, say. Its threads are named by id; the
default --thread '' shows the one with the most samples first.

Each line is a frame with its inclusive share of the thread's samples (and seconds at --rate),
children indented under it; frames under --min percent are folded away, and the import
machinery's own frames are left out (the imported module's `<module>` frame stays). Chains of frames with
one child each are shown on one line. Idle samples count (a thread waiting on the GPU or a lock
is time a user waits too). For reading fixed costs (imports, loads, first calls), not a timing.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

_FRAME = re.compile(r"^(.*) \((.*)\)$")


def parse(path: Path, thread: str) -> dict:
    """{thread name: [(frames, count)]} of the stacks whose thread name contains `thread`."""
    out: dict = {}
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        name = frames[0]
        if thread and thread not in name:
            continue
        out.setdefault(name, []).append((frames[1:], int(count)))
    return out


def parse_speedscope(path: Path, thread: str, start: float, until: float) -> dict:
    """{thread name: [(frames, count)]} of the samples in [start, until) seconds, one count a sample."""
    doc = json.loads(path.read_text())
    frames = [f"{f['name']} ({f.get('file')}:{f.get('line')})" for f in doc["shared"]["frames"]]
    out: dict = {}
    for prof in sorted(doc["profiles"], key=lambda p: -len(p["samples"])):
        if thread and thread not in prof["name"]:
            continue
        t, stacks = 0.0, out.setdefault(prof["name"], [])
        for sample, weight in zip(prof["samples"], prof["weights"]):
            if start <= t < until:
                stacks.append(([frames[i] for i in sample], 1))
            t += weight
    return out


def tree(stacks: list) -> dict:
    root: dict = {"n": 0, "kids": {}}
    for frames, count in stacks:
        node = root
        node["n"] += count
        for f in frames:
            if "<frozen importlib" in f:  # the import machinery: its module's frame says what was imported
                continue
            node = node["kids"].setdefault(f, {"n": 0, "kids": {}})
            node["n"] += count
    return root


def short(frame: str) -> str:
    m = _FRAME.match(frame)
    if not m:
        return frame
    fn, where = m.groups()
    where = re.sub(r"^.*/site-packages/", "", where)
    return f"{fn} ({where})"


def show(node: dict, total: int, rate: float, min_pct: float, depth: int, indent: int = 0) -> list:
    lines = []
    for frame, kid in sorted(node["kids"].items(), key=lambda kv: -kv[1]["n"]):
        pct = 100.0 * kid["n"] / total
        if pct < min_pct:
            continue
        chain = [short(frame)]
        while len(kid["kids"]) == 1 and len(chain) < 6:  # one child: the same time, one line
            (f2, k2), = kid["kids"].items()
            if k2["n"] != kid["n"]:
                break
            chain.append(short(f2))
            kid = k2
        lines.append(f"{'  ' * indent}{pct:5.1f}% {kid['n'] / rate:6.1f}s  {' > '.join(chain)}")
        if indent < depth:
            lines += show(kid, total, rate, min_pct, depth, indent + 1)
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("profile", type=Path)
    p.add_argument("--thread", default="MainThread", help="a substring of the thread names to show ('' for all)")
    p.add_argument("--min", type=float, default=1.0, help="fold frames under this percent of the samples")
    p.add_argument("--depth", type=int, default=40)
    p.add_argument("--rate", type=float, default=50.0, help="the samples a second py-spy took (--rate)")
    p.add_argument("--from", dest="start", type=float, default=0.0, help="speedscope: from this second")
    p.add_argument("--until", type=float, default=float("inf"), help="speedscope: up to this second")
    a = p.parse_args()
    if a.profile.read_bytes()[:1] == b"{":
        threads = parse_speedscope(a.profile, "" if a.thread == "MainThread" else a.thread, a.start, a.until)
    else:
        threads = parse(a.profile, a.thread)
    for name, stacks in threads.items():
        root = tree(stacks)
        if not root["n"]:
            continue
        print(f"== {name}: {root['n']} samples, {root['n'] / a.rate:.1f} s")
        print("\n".join(show(root, root["n"], a.rate, a.min, a.depth)))


if __name__ == "__main__":
    main()
