"""The columns of each shard's parquet: the fields of the items' json that make the run one table.

`jobs.worker.samples.item_meta` is the sample's json (`KEY.json`); `ITEM_SPEC` names the json fields that become
columns of `shard-*.parquet` (sinks/sidecars.py) with one Arrow type each, so every shard of every
run has the same schema and the run reads as one table:

    duckdb.sql("SELECT mode, count(*) FROM read_parquet('OUT/*.parquet') GROUP BY mode")

`key`, `shard`, `members` and `bytes` are added by the sink.
"""

from __future__ import annotations

from sinks.sidecars import MetaSpec

ITEM_SPEC = MetaSpec(
    columns=(
        ("prompt", "string"), ("negative_prompt", "string"), ("seed", "int64"), ("width", "int64"),
        ("height", "int64"), ("steps", "int64"), ("guidance_scale", "float64"), ("cfg", "bool"),
        ("dtype", "string"), ("model", "string"), ("text_tokens", "int64"), ("bucket", "int64"),
        ("signature", "string"), ("mode", "string"), ("batch_size", "int64"), ("truncated", "bool"),
        ("nonfinite", "bool"), ("source", "string"),
        ("num_frames", "int64"), ("fps", "float64"),  # videos only (null for images)
        ("latent_sha256", "string"),  # the denoised latents' digest (null in shards made before it existed)
    ),
    tally=("mode", "nonfinite", "signature"),
)

# Fields a sample's json has besides ITEM_SPEC's columns: a kept dataset field may not take these names.
JSON_ONLY = ("key", "shard", "members", "bytes", "audio_sample_rate", "audio_samples", "audio_channels")


def item_spec(keep_fields=()) -> MetaSpec:
    """ITEM_SPEC plus a `json` column per kept dataset field (dataset.keep_fields), in the given order:
    a string column with the value as the row gave it (a string as itself, anything else as JSON)."""
    if not keep_fields:
        return ITEM_SPEC
    return MetaSpec(columns=ITEM_SPEC.columns + tuple((name, "json") for name in keep_fields), tally=ITEM_SPEC.tally)


def reserved_names() -> set:
    """Names a sample's json already uses."""
    return {name for name, _ in ITEM_SPEC.columns} | set(JSON_ONLY)
