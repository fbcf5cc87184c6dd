"""A remote copy of an output folder on an object store, through fsspec (`s3://`, `gs://`, ...).

Shards are written and committed locally (a staging folder: temp name, fsync, link), then
uploaded whole, each file with one call (`put_file`):

    NAME.tar  ─▶  NAME.parquet, NAME_stats.json  ─▶  _manifest/NAME.tar.json  ─▶  local payload removed

An object appears only when its upload completes: a single PUT is atomic, and a large file goes
as a multipart upload that the store assembles only at `CompleteMultipartUpload`, after the last
part (s3fs aborts it on an error; a killed process leaves an incomplete upload, which is never
visible as an object: an `AbortIncompleteMultipartUpload` lifecycle rule reclaims its space).
The manifest goes last, so it is the remote commit marker: a remote shard without its manifest
is an upload cut short, not committed, and `scan` removes it (its samples are generated again).

Credentials and endpoints come from where fsspec and the store's library look (for S3:
`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` or `~/.aws/`, `AWS_ENDPOINT_URL`, or fsspec's config
such as `FSSPEC_S3_ENDPOINT_URL`), never from dataset rows.

Knows nothing of plans or units: names are relative to the output folder, globs select shards.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
import time
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

from sinks.manifest import ShardRecord, manifest_path, write_manifest
from sinks.names import MANIFEST_DIR, QUARANTINE_DIR
from sinks.owned_scan import Ownership, is_foreign, ownership_problems
from sinks.sidecars import sidecar_names

log = logging.getLogger(__name__)



class Remote:
    """The remote output folder `url` (an fsspec URL with a protocol, e.g. `s3://bucket/prefix`)."""

    def __init__(self, url: str, chunksize: Optional[int] = None):
        import fsspec

        self.url = url.rstrip("/")
        self.fs, self.root = fsspec.core.url_to_fs(self.url)
        self.root = self.root.rstrip("/")
        self.chunksize = chunksize  # multipart part size (s3fs, gcsfs); None: the library's default

    def path(self, name: str) -> str:
        return f"{self.root}/{name}"

    # -- plain files ---------------------------------------------------------------------------

    def put(self, local: Path, name: str, callback=None) -> None:
        kwargs = {"chunksize": self.chunksize} if self.chunksize else {}
        if callback is not None:
            kwargs["callback"] = callback  # an fsspec Callback: told of each part (tests kill mid-upload)
        self.fs.put_file(str(local), self.path(name), **kwargs)

    def put_bytes(self, name: str, data: bytes) -> None:
        self.fs.pipe_file(self.path(name), data)

    def read_bytes(self, name: str) -> Optional[bytes]:
        try:
            return self.fs.cat_file(self.path(name))
        except FileNotFoundError:
            return None

    def get(self, name: str, local: Path) -> None:
        """Download to `local` through a temp name: a killed download leaves no torn file there."""
        from sinks.atomic import temp_path_for

        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_path_for(local)
        self.fs.get_file(self.path(name), str(tmp))
        os.replace(tmp, local)

    def stamp(self, name: str) -> str:
        """The object's ETag (what a listing shows of it), as the stamp its manifest records."""
        self.fs.invalidate_cache(self.path(name))
        return entry_stamp(self.fs.info(self.path(name)))

    def sizes(self, prefix: str = "", pattern: str = "*") -> Dict[str, int]:
        return {n: size for n, (size, _) in self.listing(prefix, pattern).items()}

    def listing(self, prefix: str = "", pattern: str = "*") -> Dict[str, Tuple[int, str]]:
        """{name relative to the root: (size, stamp)} of the objects directly under `prefix` matching `pattern`.
        The pattern's literal head is sent as the listing's prefix where the store filters by it
        (s3fs, gcsfs): one unit's shards are listed without listing every shard of the run."""
        return {n: (int(e["size"]), entry_stamp(e)) for n, e in self._entries(prefix, pattern).items()}

    def modified(self, prefix: str = "", pattern: str = "*") -> Dict[str, float]:
        """{name: last-modified time (epoch seconds, the store's own clock)} of the objects `listing`
        lists: times of writers on other hosts compare without trusting their clocks."""
        return {n: entry_modified(e) for n, e in self._entries(prefix, pattern).items()}

    def _entries(self, prefix: str, pattern: str) -> Dict[str, dict]:
        base = self.path(prefix).rstrip("/") if prefix else self.root
        self.fs.invalidate_cache(base)  # other processes write here: never trust a cached listing
        head = re.split(r"[*?\[]", pattern, maxsplit=1)[0]
        try:
            try:
                found = self.fs.find(base, maxdepth=1, detail=True, prefix=head) if head else None
            except TypeError:  # a filesystem whose find has no prefix filter
                found = None
            if found is None:
                found = {e["name"]: e for e in self.fs.ls(base, detail=True)}
        except FileNotFoundError:
            return {}
        out = {}
        for e in found.values():
            name = e["name"].rstrip("/").rsplit("/", 1)[-1]
            if e.get("type") == "file" and fnmatch.fnmatchcase(name, pattern):
                out[f"{prefix.rstrip('/')}/{name}" if prefix else name] = e
        return out

    def rm(self, names: List[str]) -> None:
        if names:
            self.fs.rm([self.path(n) for n in names])

    def move(self, name: str, to: str) -> None:
        self.fs.mv(self.path(name), self.path(to))

    def check_writable(self) -> None:
        """Write and delete a probe object; raises what the store raised (no credentials, no bucket)."""
        probe = f".write-probe-{os.uname().nodename}-{os.getpid()}"
        self.put_bytes(probe, b"")
        self.rm([probe])

    # -- shards --------------------------------------------------------------------------------

    def push_shard(self, local_dir: Path, record: ShardRecord, before_manifest=None) -> None:
        """Upload a committed local shard: tar, sidecars, then its manifest (the remote commit);
        then remove the local tar and sidecars. The local manifest stays: it keeps the name taken."""
        local_dir = Path(local_dir)
        names = [record.url] + [s[0] for s in record.sidecars]
        stamps = {}
        for name in names:
            self.put(local_dir / name, name)
            stamps[name] = self.stamp(name)
        # The manifest that goes up records the objects' ETags: a listing then tells an object
        # rewritten since its upload, at the same size (the job's resume check, one listing).
        record.stamps = stamps
        write_manifest(local_dir, record)
        if before_manifest is not None:
            before_manifest()
        self.put(manifest_path(local_dir, record.url), f"{MANIFEST_DIR}/{record.url}.json")
        drop_payload(local_dir, record)
        log.debug("uploaded %s (%d bytes) to %s", record.url, record.filesize, self.url)

    def scan(self, tar_glob: str, verify: str, local_dir: Path,
             owner: Optional["Ownership"] = None) -> Tuple[List[ShardRecord], List[dict]]:
        """The committed remote shards matching `tar_glob`: those whose manifest is there and whose
        objects have the sizes it lists (`full`: the tar's sha256 too, downloading it). A shard that
        differs is moved to the remote `_quarantine/`; objects without a manifest (an upload cut
        short) are deleted. Writes each committed manifest into `local_dir/_manifest/` (so a local
        writer never reuses the name) and removes local manifests of shards the remote does not
        have. Run it only while no one else writes these names (the caller holds their lease)."""
        from sinks.manifest import load_manifest
        from sinks.sidecars import sidecar_globs

        objects: Dict[str, Tuple[int, str]] = {}
        for pattern in (tar_glob, *sidecar_globs(tar_glob)):
            objects.update(self.listing("", pattern))
        manifests = self.sizes(MANIFEST_DIR, f"{tar_glob}.json")
        records: List[ShardRecord] = []
        quarantined: List[dict] = []
        keep: Set[str] = set()
        taken: Set[str] = set()
        for mname in sorted(manifests):
            url = mname.rsplit("/", 1)[-1][: -len(".json")]
            local = manifest_path(local_dir, url)
            data = self.read_bytes(mname)
            if data is None:
                continue
            local.parent.mkdir(parents=True, exist_ok=True)
            from sinks.atomic import atomic_write_bytes

            atomic_write_bytes(local, data)
            record = load_manifest(local_dir, url)
            if record is not None and owner is not None and is_foreign(record, owner):
                log.warning("remote shard %s/%s: its manifest is another run's (run %s, this run is %s): left alone, "
                            "never indexed", self.url, url, record.run, owner.run)
                local.unlink(missing_ok=True)
                keep.update([url] + [s[0] for s in record.sidecars])
                continue
            if record is None:
                problems = ["unreadable manifest"]
            else:
                problems = self._differences(record, url, objects, verify)
                if not problems and owner is not None:
                    problems = ownership_problems(record, owner, taken)
            if problems:
                quarantined.append(self._quarantine(url, "; ".join(problems), record))
                local.unlink(missing_ok=True)
                continue
            assert record is not None  # an unreadable manifest is a problem above
            records.append(record)
            taken.update(record.keys)
            keep.update([url] + [s[0] for s in record.sidecars])
        orphans = sorted(set(objects) - keep)
        if orphans:
            log.info("removing %d object(s) of uploads cut short (no manifest): %s", len(orphans),
                     ", ".join(orphans[:5]))
            self.rm(orphans)
        committed = {r.url for r in records}
        for path in sorted((Path(local_dir) / MANIFEST_DIR).glob(f"{tar_glob}.json")):
            url = path.name[: -len(".json")]
            if url not in committed and not (Path(local_dir) / url).exists():
                path.unlink()  # uploaded by nobody (the remote lost it, or quarantined it just now)
        return records, quarantined

    def _differences(
        self, record: ShardRecord, url: str, objects: Dict[str, Tuple[int, str]], verify: str
    ) -> List[str]:
        """Sizes from the listing; sha256 of every object with `full`, and of an object whose ETag moved
        since its upload (rewritten in place, at the same size) with `members`."""
        problems, rewritten = [], []
        for name, size in [(url, record.filesize)] + [(s[0], s[1]) for s in record.sidecars]:
            found = objects.get(name)
            if found is None:
                problems.append(f"{name} is missing")
            elif found[0] != size:
                problems.append(f"{name}: {found[0]} bytes, manifest says {size}")
            elif record.stamps.get(name) not in (None, found[1]):
                rewritten.append(name)
        if not problems:
            for name, sha256 in [(url, record.sha256)] + [(s[0], s[2]) for s in record.sidecars]:
                if (verify == "full" or name in rewritten) and self.sha256(name) != sha256:
                    problems.append(f"{name}: sha256 differs from the manifest's")
        return problems

    def sha256(self, name: str) -> str:
        import hashlib

        digest = hashlib.sha256()
        with self.fs.open(self.path(name), "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        return digest.hexdigest()

    def _quarantine(self, url: str, reason: str, record: Optional[ShardRecord]) -> dict:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        target = f"{QUARANTINE_DIR}/{url}.{stamp}"
        for name, dest in [(n, f"{target}.{n[len(url) - 4:].lstrip('._')}") for n in sidecar_names(url)] + [
                (url, target), (f"{MANIFEST_DIR}/{url}.json", f"{target}.manifest.json")]:
            try:
                self.move(name, dest)
            except FileNotFoundError:
                pass
        entry = {"url": url, "moved_to": target, "reason": reason, "nsamples": record.nsamples if record else None,
                 "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "remote": self.url}
        log.warning("remote shard %s/%s does not match its manifest (%s): moved to %s; its samples will be generated "
                    "again", self.url, url, reason, target)
        return entry


def entry_stamp(entry: dict) -> str:
    """An object's stamp from its listing or info entry: the ETag (S3, GCS), else its mtime."""
    for name in ("ETag", "etag", "md5Hash", "mtime", "LastModified"):
        if entry.get(name) is not None:
            return str(entry[name]).strip('"')
    return ""


def entry_modified(entry: dict) -> float:
    """An object's last-modified time from its listing entry, in epoch seconds: S3's LastModified (a
    datetime, whole seconds), GCS's `updated`, a local filesystem's mtime; 0.0 where none is given."""
    from datetime import datetime

    for name in ("LastModified", "updated", "mtime", "last_modified"):
        value = entry.get(name)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return 0.0


def drop_payload(local_dir: Path, record: ShardRecord) -> None:
    """Remove a shard's tar and sidecars from the staging folder, sidecars first: a kill in between
    leaves a tar (rebuilt into a whole shard by the next scan), never a parquet without its shard."""
    for name in reversed([record.url] + [s[0] for s in record.sidecars]):
        (Path(local_dir) / name).unlink(missing_ok=True)


def describe_error(url: str, err: BaseException) -> str:
    """A store error as one line that says where to look (credentials, endpoint, bucket)."""
    text = f"{type(err).__name__}: {err}".strip()
    return (f"output_dir={url!r}: the object store refused or could not be reached ({text[:300]}). Credentials and "
            f"endpoints come from the environment or the store's config files (S3: AWS_ACCESS_KEY_ID/"
            f"AWS_SECRET_ACCESS_KEY or ~/.aws/credentials, AWS_ENDPOINT_URL for a non-AWS server; GCS: "
            f"GOOGLE_APPLICATION_CREDENTIALS); check them and that the bucket exists")
