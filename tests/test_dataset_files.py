"""Folder and brace-list datasets (README: `dataset.path`), planned as the row-by-row reader reads them,
and run from the command line: every file in sorted order, `file:line` sources of the right file,
per-file derived keys, one digest over every file that a rerun checks by stat."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from jobs.dataset import DatasetConfig, DatasetError, load_dataset
from jobs.errors import UserError
from jobs.models.registry import get_family
from jobs.output.layout import PLAN_DIR, PLAN_FILE, unit_name
from jobs.plan import derive_seed
from jobs.plan.build import plan_dataset
from jobs.plan.publish import open_plan
from jobs.plan.units import read_unit
from tests.helpers import compose_cfg, prompts, write_jsonl

ROOT = Path(__file__).resolve().parents[1]
FAST = ["sampling.steps=2", "sampling.height=64", "sampling.width=64", "job.progress=false"]


def _cfg(tmp_path, path, *extra):
    return compose_cfg([f"dataset.path={path}", f"output_dir={tmp_path / 'out'}", "sampling.height=64",
                        "sampling.width=64", "sampling.steps=2", *extra])


def _plan(cfg, work):
    return plan_dataset(cfg, get_family(cfg.model.family).spatial_divisor(cfg.model), work)


def _items(work, result):
    m = result.manifest
    return [it for u in m.units for it in read_unit(work, u, m.source_files, "float32")]


def _mixed_folder(tmp_path: Path) -> Path:
    """Four files of three kinds: clean JSONL (the fast lane), TXT (row by row), JSONL the fast lane
    declines (a CRLF line), and a duplicate key across files; plus what a folder read skips."""
    folder = tmp_path / "prompts"
    folder.mkdir()
    rows = prompts(40)
    for r in rows[::6]:
        r["width"] = 128  # a second signature, across files
    write_jsonl(folder / "b.jsonl", rows[:25])
    (folder / "a.txt").write_text("a red fox\n\nsnow on a hill\n")
    crlf = [json.dumps(r) for r in rows[25:]] + [json.dumps({"prompt": "no key here"}),
                                                 json.dumps({"key": "k003", "prompt": "dup of b.jsonl:4"})]
    (folder / "c.jsonl").write_bytes("\r\n".join(crlf).encode() + b"\r\n")
    write_jsonl(folder / "d.jsonl", [{"prompt": "keyless, in the last file"}, {"key": "last", "prompt": "z"}])
    (folder / ".hidden.jsonl").write_text('{"prompt": "never"}\n')
    (folder / "notes.md").write_text("not a prompt file\n")
    return folder


def test_a_folder_plans_every_file_in_order_as_the_reader_reads_it(tmp_path):
    folder = _mixed_folder(tmp_path)
    reference = load_dataset(DatasetConfig(path=str(folder), on_error="skip"))
    cfg = _cfg(tmp_path, folder, "dataset.on_error=skip", "plan.unit_items=7", "plan.workers=1")
    result = _plan(cfg, tmp_path / "w")
    want = {r.key: (r.prompt, r.source, r.seed if r.seed is not None else derive_seed(cfg.sampling.seed, r.key))
            for r in reference.records}
    got = {it.key: (it.prompt, it.source, it.seed) for it in _items(tmp_path / "w", result)}
    assert got == want and len(got) == 2 + 25 + 16 + 2  # a.txt, b.jsonl, c.jsonl less the duplicate, d.jsonl
    assert got["a-000003"][1] == f"{folder / 'a.txt'}:3" and got["c-000016"][1] == f"{folder / 'c.jsonl'}:16"
    assert got["d-000001"][1] == f"{folder / 'd.jsonl'}:1"  # derived keys: each file's stem and line
    assert [str(e) for e in result.errors] == [str(e) for e in reference.errors] == [
        f"{folder / 'c.jsonl'}:17: duplicate key 'k003' (first at {folder / 'b.jsonl'}:4)"]
    order = {r.key: i for i, r in enumerate(reference.records)}
    for u in result.manifest.units:  # dataset order (file, then line) inside every unit
        keys = [it.key for it in read_unit(tmp_path / "w", u, result.manifest.source_files, "float32")]
        assert [order[k] for k in keys] == sorted(order[k] for k in keys)
    files = result.manifest.dataset["files"]
    assert [f["path"] for f in files] == [str(folder / n) for n in ("a.txt", "b.jsonl", "c.jsonl", "d.jsonl")]
    assert result.manifest.dataset["format"] == "jsonl+txt"


def test_several_files_plan_the_same_for_any_processes_and_chunk_size(tmp_path):
    folder = _mixed_folder(tmp_path)
    one = _plan(_cfg(tmp_path, folder, "dataset.on_error=skip", "plan.unit_items=7", "plan.workers=1"), tmp_path / "a")
    many = _plan(_cfg(tmp_path, folder, "dataset.on_error=skip", "plan.unit_items=7", "plan.workers=2",
                      "plan.chunk_mb=0.0005"), tmp_path / "b")
    assert one.manifest.to_json() == many.manifest.to_json()
    for u in one.manifest.units:
        name = f"{unit_name(u.id)}.parquet"
        assert pq.read_table(tmp_path / "a" / name).equals(pq.read_table(tmp_path / "b" / name))


def test_a_limit_counts_rows_across_files_in_order(tmp_path):
    folder = _mixed_folder(tmp_path)
    reference = load_dataset(DatasetConfig(path=str(folder), on_error="skip", limit=9))
    result = _plan(_cfg(tmp_path, folder, "dataset.on_error=skip", "dataset.limit=9"), tmp_path / "w")
    assert sorted(it.key for it in _items(tmp_path / "w", result)) == sorted(r.key for r in reference.records)
    assert {r.source.rpartition(":")[0] for r in reference.records} == {str(folder / "a.txt"), str(folder / "b.jsonl")}


def test_a_brace_list_and_a_folder_of_one_file_plan_as_that_file(tmp_path):
    data = write_jsonl(tmp_path / "p-1.jsonl", prompts(12))
    alone = tmp_path / "alone"
    alone.mkdir()
    write_jsonl(alone / "p-1.jsonl", prompts(12))
    os.utime(alone / "p-1.jsonl", ns=(data.stat().st_atime_ns, data.stat().st_mtime_ns))
    plans = [_plan(_cfg(tmp_path, path, "plan.unit_items=5"), tmp_path / f"w{i}")
             for i, path in enumerate([data, f'"{tmp_path}/p-{{1..1}}.jsonl"', alone])]
    dumps = [p.manifest.to_json() for p in plans]
    assert "files" not in dumps[0]["dataset"]
    for d in dumps:
        d["dataset"].pop("path")
    assert dumps[0] == dumps[1] == dumps[2]  # one file: the plan it always was, whatever named it
    for u in plans[0].manifest.units:
        name = f"{unit_name(u.id)}.parquet"
        assert {(tmp_path / f"w{i}" / name).read_bytes() for i in range(3)} == {(tmp_path / "w0" / name).read_bytes()}
        assert "file" not in pq.read_table(tmp_path / "w0" / name).column_names


def test_the_digest_covers_every_file_and_a_rerun_reads_only_what_moved(tmp_path, caplog):
    import logging

    for i in range(3):
        write_jsonl(tmp_path / f"p-{i}.jsonl", prompts(30)[i * 10:(i + 1) * 10])
    brace = f'"{tmp_path}/p-{{0..2}}.jsonl"'
    cfg = _cfg(tmp_path, brace)
    divisor = get_family(cfg.model.family).spatial_divisor(cfg.model)
    out = tmp_path / "out"
    made = open_plan(cfg, out, divisor)
    assert [f["path"] for f in made.dataset["files"]] == [str(tmp_path / f"p-{i}.jsonl") for i in range(3)]
    plan_json = (out / PLAN_DIR / PLAN_FILE).read_bytes()
    with caplog.at_level(logging.INFO, logger="jobs.plan"):
        assert open_plan(cfg, out, divisor).n_items == 30  # joined: nothing hashed
        assert "hashing" not in caplog.text and "joining the plan" in caplog.text
        os.utime(tmp_path / "p-1.jsonl")  # touched, same bytes: hashed again, and joined
        assert open_plan(cfg, out, divisor).n_items == 30
    hashed = [r.getMessage() for r in caplog.records if "hashing" in r.getMessage()]
    assert hashed == [f"dataset file {tmp_path / 'p-1.jsonl'} changed size or mtime since it was planned: "
                      f"hashing it to compare"]
    text = (tmp_path / "p-2.jsonl").read_text()
    (tmp_path / "p-2.jsonl").write_text(text.replace("k020", "k02x"))  # one byte of the last file
    with pytest.raises(UserError, match="dataset.digest: "):
        open_plan(cfg, out, divisor)
    (tmp_path / "p-2.jsonl").write_text(text)
    write_jsonl(tmp_path / "p-3.jsonl", [{"key": "new", "prompt": "a file more"}])
    with pytest.raises(UserError, match="dataset.digest: "):  # the list grew
        open_plan(_cfg(tmp_path, f'"{tmp_path}/p-{{0..3}}.jsonl"'), out, divisor)
    assert (out / PLAN_DIR / PLAN_FILE).read_bytes() == plan_json  # nothing replanned


def _run_cli(*overrides: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "jobs.generate", *overrides], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def _sources(out: Path) -> dict:
    out_map = {}
    for path in sorted(out.glob("shard-*.parquet")):
        table = pq.read_table(path, columns=["key", "source"]).to_pydict()
        out_map.update(zip(table["key"], table["source"]))
    return out_map


def test_cli_a_folder_dataset_generates_every_file(tmp_path):
    folder = tmp_path / "prompts"
    folder.mkdir()
    write_jsonl(folder / "one.jsonl", [{"prompt": "a red circle"}, {"key": "x", "prompt": "a blue square"}])
    (folder / "two.txt").write_text("a green star\n")
    out = tmp_path / "out"
    proc = _run_cli(f"dataset.path={folder}", f"output_dir={out}", *FAST)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _sources(out) == {"one-000001": f"{folder / 'one.jsonl'}:1", "x": f"{folder / 'one.jsonl'}:2",
                             "two-000001": f"{folder / 'two.txt'}:1"}
    index = json.loads((out / "index.wids.json").read_text())
    assert sum(s["nsamples"] for s in index["shardlist"]) == 3


def test_cli_a_brace_list_quoted_for_hydra_runs_and_unquoted_names_the_quoting(tmp_path):
    for i in range(2):
        write_jsonl(tmp_path / f"p-{i:02d}.jsonl", [{"key": f"k{i}", "prompt": f"a red circle {i}"}])
    out = tmp_path / "out"
    pattern = f"{tmp_path}/p-{{00..01}}.jsonl"
    bare = _run_cli(f"dataset.path={pattern}", f"output_dir={out}", *FAST)
    assert bare.returncode == 2 and "Traceback" not in bare.stderr
    assert (f"command line: 'dataset.path={pattern}': Hydra reads an unquoted '{{' as the start of a dictionary. "
            f"Quote the value for Hydra, inside quotes for the shell: 'dataset.path=\"{pattern}\"'") in bare.stderr
    assert not out.exists()  # refused before Hydra made a folder
    proc = _run_cli(f'dataset.path="{pattern}"', f"output_dir={out}", *FAST)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _sources(out) == {"k0": f"{tmp_path / 'p-00.jsonl'}:1", "k1": f"{tmp_path / 'p-01.jsonl'}:1"}
    missing = _run_cli(f'dataset.path="{tmp_path}/p-{{00..02}}.jsonl"', f"output_dir={tmp_path / 'o2'}", *FAST)
    assert missing.returncode == 2 and "names 3 files and 1 do not exist" in missing.stdout + missing.stderr


def test_a_valid_dict_override_is_not_taken_for_a_brace_list():
    from jobs.cli_check import _brace_hint

    assert _brace_hint(["model.tiny.vae={latent_channels:4}", "sampling.steps=oops{"]) == (
        "command line: 'sampling.steps=oops{': Hydra reads an unquoted '{' as the start of a dictionary. Quote the "
        "value for Hydra, inside quotes for the shell: 'sampling.steps=\"oops{\"' (a brace list such as "
        "dataset.path=\"prompts-{000..099}.jsonl\" names every file of the range)")


def test_a_folder_without_prompt_files_says_what_it_looked_for(tmp_path):
    (tmp_path / "notes.md").write_text("x")
    with pytest.raises(DatasetError, match="is a directory with no files ending in .jsonl"):
        _plan(_cfg(tmp_path, tmp_path), tmp_path / "w")


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="needs Linux's /proc")
@pytest.mark.parametrize("ext", ["jsonl", "txt", "csv"])
def test_a_file_that_cannot_be_read_is_named_with_the_fix(tmp_path, ext):
    """An I/O error reading a dataset file (/proc/self/mem reads as EIO) was a traceback from the planner, and
    under jobs.generate an exit 75, which a scheduler retries forever, saying 'writing'. The planner names it."""
    broken = tmp_path / f"broken.{ext}"
    broken.symlink_to("/proc/self/mem")
    cfg = _cfg(tmp_path, broken)
    with pytest.raises(DatasetError, match=rf"dataset.path='{broken}': cannot read it \(Input/output error\); "
                                           r"check its permissions and its disk"):
        _plan(cfg, tmp_path / "work")


def test_a_dataset_folder_that_is_the_output_dir_is_refused_before_anything_is_written(tmp_path):
    """Its first run worked; every rerun then read the run's shards and parquet as prompt files and was refused as
    another dataset, so a killed run could not resume."""
    from jobs.preflight import check_config

    folder = tmp_path / "data"
    folder.mkdir()
    write_jsonl(folder / "p.jsonl", prompts(2))
    with pytest.raises(UserError, match=r"dataset.path='.*data' is the output_dir: a rerun would read the run's own "
                                        r"shards and parquet as prompts"):
        check_config(compose_cfg([f"dataset.path={folder}", f"output_dir={folder}"]))
    assert sorted(p.name for p in folder.iterdir()) == ["p.jsonl"]
    check_config(compose_cfg([f"dataset.path={folder / 'p.jsonl'}", f"output_dir={folder}"]))  # a file: fine


def test_keyless_rows_of_two_files_with_one_name_stem_are_refused_saying_how_to_tell_them_apart(tmp_path):
    """a/p.txt and b/p.txt derive the same keys (p-000001, ...): the planner and the row reader both name the
    collision and its fix, where a bare "duplicate key" would send the user looking for a key in the file."""
    for folder, text in (("a", "red fox\nblue lake\n"), ("b", "green hill\n")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "p.txt").write_text(text)
    write_jsonl(tmp_path / "a" / "q.jsonl", [{"key": "p-000001", "prompt": "a given key"}])
    path = f"{tmp_path}/{{a,b}}/p.txt"
    want = (f"{tmp_path / 'b' / 'p.txt'}:1: duplicate key 'p-000001' (first at {tmp_path / 'a' / 'p.txt'}:1): "
            f"keyless rows of files that share the name stem 'p' get the same keys (<file stem>-<line>); rename "
            f"one of the files, or give their rows a key")
    reference = load_dataset(DatasetConfig(path=path, on_error="skip"))
    result = _plan(_cfg(tmp_path, f'"{path}"', "dataset.on_error=skip"), tmp_path / "w")  # quoted for Hydra
    assert [str(e) for e in result.errors] == [str(e) for e in reference.errors] == [want]
    # A given key equal to a derived one is not this case: the plain message (the row readers say more).
    given = _plan(_cfg(tmp_path, f'"{tmp_path}/a/{{p.txt,q.jsonl}}"', "dataset.on_error=skip"), tmp_path / "w2")
    assert [e.reason for e in given.errors] == [f"duplicate key 'p-000001' (first at {tmp_path / 'a' / 'p.txt'}:1)"]
