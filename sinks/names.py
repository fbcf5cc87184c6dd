"""The names sinks/ gives things in an output folder, in one place (no module of sinks/ owns them).

Manifests, quarantine and the remote mirror all need the same folder names; defining them here
keeps `manifest` and `quarantine` from importing each other for a string.
"""

MANIFEST_DIR = "_manifest"  # one `<shard>.json` per committed shard: keys, members, sizes, sha256
QUARANTINE_DIR = "_quarantine"  # shards (and their sidecars) that no longer matched their manifest
QUARANTINE_LOG = "log.jsonl"  # inside QUARANTINE_DIR: one line per shard moved aside, and why
INDEX_NAME = "index.wids.json"  # the wids shard index (`wids-shard-index-v1`)
