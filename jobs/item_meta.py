"""What each generated item records: its json in the tar, and the columns of its shard's parquet.

`item_meta` is the sample's json (`KEY.json`); `ITEM_SPEC` names the json fields that become
columns of `shard-*.parquet` (sinks/sidecars.py) with one Arrow type each, so every shard of every
run has the same schema and the run reads as one table:

    duckdb.sql("SELECT mode, count(*) FROM read_parquet('OUT/*.parquet') GROUP BY mode")

`key`, `shard`, `members` and `bytes` are added by the sink.
"""

from __future__ import annotations

from jobs.plan import Item
from sinks.sidecars import MetaSpec


def item_meta(it: Item, model: str, mode: str, batch_size: int, finite: bool) -> dict:
    s = it.signature
    return {
        "key": it.key, "prompt": it.prompt, "negative_prompt": it.negative_prompt, "seed": it.seed,
        "width": s.width, "height": s.height, "steps": s.steps, "guidance_scale": s.guidance_scale,
        "cfg": s.cfg, "dtype": s.dtype, "model": model, "text_tokens": it.text_tokens,
        "bucket": s.text_bucket, "signature": str(s), "mode": mode, "batch_size": batch_size,
        "truncated": it.truncated, "nonfinite": not finite, "source": it.source,
    }


ITEM_SPEC = MetaSpec(
    columns=(
        ("prompt", "string"), ("negative_prompt", "string"), ("seed", "int64"), ("width", "int64"),
        ("height", "int64"), ("steps", "int64"), ("guidance_scale", "float64"), ("cfg", "bool"),
        ("dtype", "string"), ("model", "string"), ("text_tokens", "int64"), ("bucket", "int64"),
        ("signature", "string"), ("mode", "string"), ("batch_size", "int64"), ("truncated", "bool"),
        ("nonfinite", "bool"), ("source", "string"),
    ),
    tally=("mode", "nonfinite", "signature"),
)
