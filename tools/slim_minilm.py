"""MiniLM for a machine that cannot take its 87 MB of weights: only the demo vocabulary's rows.

    python tools/slim_minilm.py slim DIR            # here: DIR/slim.safetensors (~44 MB) + tokenizer
    python tools/slim_minilm.py expand DIR OUT      # there: OUT, a transformers folder + kept_ids.json

The word-embedding table is half of MiniLM (30,522 rows x 384). The demo captions and the bundled
prompts use a few hundred wordpieces: `slim` keeps those rows and every other weight in full
float32, so the encoder's output for those tokens is exactly the package's. `expand` rebuilds a
normal folder (other rows zero) that `model.tiny.text_encoder=OUT` and tools/train_demo.py
`--text-encoder OUT` read; the trainer checks every caption token is among `kept_ids.json`.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TABLE = "embeddings.word_embeddings.weight"
TOKENIZER_FILES = ("config.json", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt")


def demo_texts() -> list:
    """Every string the demo captions and the bundled prompts are made of, plus many samples."""
    from jobs.demo import captions as C
    from jobs.demo import prompt_set
    from jobs.demo.scenes import COLOR_NAMES, SHAPES

    texts = list(C.TRAIN_TEMPLATES) + list(C.HELDOUT_TEMPLATES) + [t for t, _ in C.PARTIAL_TEMPLATES]
    texts += list(C.TRAIN_FILLER) + list(C.HELDOUT_FILLER) + list(C.CORNER_PHRASES) + list(COLOR_NAMES) + list(SHAPES)
    texts += [w for ws in C.SHAPE_WORDS.values() for w in ws] + [w for ws in C.SIZE_WORDS.values() for w in ws]
    texts += ["in the center in the middle centered on the left right at the side top bottom near upper lower corner"]
    for row in prompt_set.build_rows():
        texts += [row["prompt"], row.get("negative_prompt", "")]
    rng = random.Random(0)
    texts += [c for c, _ in C.train_pool(rng, 20000)]
    texts += [C.heldout_caption(rng, C.random_labels(rng)) for _ in range(5000)]
    return texts


def slim(out: Path) -> None:
    from safetensors.torch import load_file, save_file

    from jobs.models.text_encoders import load_tokenizer, minilm_path

    src = Path(minilm_path())
    tok = load_tokenizer("minilm")
    ids = set(tok.all_special_ids)
    for text in demo_texts():
        ids.update(tok(text.lower())["input_ids"])
    kept = torch.tensor(sorted(ids), dtype=torch.long)
    state = load_file(str(src / "model.safetensors"))
    table = state.pop(TABLE)
    state["kept_ids"], state["kept_rows"] = kept, table[kept].contiguous()
    state["table_shape"] = torch.tensor(table.shape)
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "slim.safetensors"))
    for name in TOKENIZER_FILES:
        shutil.copy(src / name, out / name)
    print(f"kept {len(kept)} of {table.shape[0]} wordpiece rows -> {out}")


def expand(src: Path, out: Path) -> None:
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModel

    state = load_file(str(src / "slim.safetensors"))
    kept, rows, shape = state.pop("kept_ids"), state.pop("kept_rows"), state.pop("table_shape")
    table = torch.zeros(tuple(shape.tolist()), dtype=rows.dtype)
    table[kept] = rows
    state[TABLE] = table
    state.pop("embeddings.position_ids", None)  # a buffer older checkpoints saved; rebuilt from the config
    model = AutoModel.from_config(AutoConfig.from_pretrained(src))
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("position_ids" in m for m in missing), (missing, unexpected)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    for name in TOKENIZER_FILES[1:]:
        shutil.copy(src / name, out / name)
    (out / "kept_ids.json").write_text(json.dumps(kept.tolist()))
    print(f"expanded {src} -> {out} ({len(kept)} rows kept)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("slim").add_argument("out", type=Path)
    e = sub.add_parser("expand")
    e.add_argument("src", type=Path)
    e.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "slim":
        slim(args.out)
    else:
        expand(args.src, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
