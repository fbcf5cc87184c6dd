"""One clean exit path: bad config, data or environment exits 2 with one message (key or
file:line, value, fix) and no traceback, before anything is created; a crash exits 1 with its
traceback."""

from __future__ import annotations

import os

import pytest
import torch

from tests.helpers import write_jsonl
from tests.test_resume_kill import FAST, cli, log_of


def refused(*args: str, env: dict | None = None) -> str:
    proc = cli(*args, env=env)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, log_of(proc)
    assert "Traceback" not in text, text
    assert text.count("[ERROR]") == 1, text  # one message
    return text


def _without(args, override: str) -> list:
    """`args` less the one that sets the key `override` sets (the command line refuses a key given twice)."""
    key = override.split("=", 1)[0].lstrip("+")
    return [a for a in args if a.split("=", 1)[0] != key]


@pytest.mark.parametrize("override,message", [
    ("sampling.stpes=4", "config: Could not override 'sampling.stpes': Key 'stpes' not in 'SamplingConfig'; known keys "
                         "there: fps, guidance_scale, height, images_per_prompt, negative_prompt, num_frames, seed, steps, width"),
    ("model=sana_huge", "config: In 'generate': Could not find 'model/sana_huge' ; available options in 'model': flux"),
    ("+foo=1", "foo is not a config key (from `+foo=...` or a yaml file?); known keys: bcg, dataset, device, job"),
    ("+sampling.stpes=4", "sampling.stpes is not a config key (from `+sampling.stpes=...` or a yaml file?); known keys "
                          "under sampling: fps, guidance_scale, height, images_per_prompt, negative_prompt, num_frames, seed, steps, width. Remove it"),
    ("sampling.steps=1000000000", "sampling.steps=1000000000 is invalid: expected an int in [1, 1000]"),
    ("sampling.height=1000000000", "sampling.height=1000000000 is invalid: expected an int in [1, 8192]"),
    ("bcg.batch_sizes=[1,100000]", "bcg.batch_sizes=[1, 100000] is invalid: expected a non-empty list of ints in [1, 1024]"),
    ("model.break_policy=[none,attn2]", "model.break_policy=['none', 'attn2'] is invalid: expected \"none\" and "
                                         "\"attention\" alone"),
    ("bcg.batch_grow=maybe", "bcg.batch_grow='maybe'"),
    ("dataset=jsonl", "dataset.format=jsonl but dataset.path is empty: pass dataset.path=/your/prompts.jsonl"),
    ("sampling.steps=2,4", "command line: 'sampling.steps=2,4' sweeps over several values; add -m (--multirun)"),
    ("model.max_sequence_length=600", "model.max_sequence_length=600, but sana_tiny's text encoder"),
])
def test_config_errors_exit_2_before_anything_is_created(tmp_path, override, message):
    out = tmp_path / "out"
    text = refused(f"output_dir={out}", *_without(FAST, override), override)  # a key once: twice is refused
    assert message in text
    assert not out.exists()  # refused before Hydra made its log folder


def test_a_bad_value_in_a_sweep_is_refused_before_any_job_starts(tmp_path):
    # The sweep folder is moved into tmp_path, which a hydra.* path override needs the user's opt-in for.
    text = refused("-m", *_without(FAST, "sampling.steps=2,0"), "sampling.steps=2,0", f"output_dir={tmp_path}/out",
                   f"hydra.sweep.dir={tmp_path}/sweep",
                   env={"BCGEN_ALLOW_HYDRA_PATHS": "1"})
    assert "sampling.steps=0 is invalid: expected an int in [1, 1000]" in text
    assert not (tmp_path / "sweep").exists()


def test_output_dir_that_is_a_file(tmp_path):
    blocker = tmp_path / "taken"
    blocker.write_bytes(b"precious")
    text = refused(f"output_dir={blocker}", *FAST)
    assert (f"output_dir='{blocker}' cannot be a directory: '{blocker}' is a file; choose another output_dir "
            f"(or move the file)") in text
    assert blocker.read_bytes() == b"precious"


def test_output_dir_not_writable(tmp_path):
    target = "/sys/bcgen-out" if os.path.isdir("/sys") else None
    if target is None or os.access("/sys", os.W_OK) and os.geteuid() != 0:
        pytest.skip("needs /sys, which refuses new folders even to root")
    text = refused(f"output_dir={target}", *FAST)
    # The probe goes into the nearest existing folder above it (nothing is created for output_dir)
    assert f"output_dir='{target}' is not writable (" in text and "in '/sys'); choose a directory you can write to" in text


def test_read_only_output_dir_for_a_normal_user(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders; /sys covers the case for root")
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    text = refused(f"output_dir={ro}/out", *FAST)
    assert "is not writable (Permission denied)" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_cuda_without_cuda(tmp_path):
    data = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a"}])
    text = refused("device=cuda", f"dataset.path={data}", f"output_dir={tmp_path / 'out'}", *FAST)
    assert "device=cuda but no CUDA device is visible here (torch.cuda.is_available() is False); use device=auto or " \
           "device=cpu" in text
    assert not list((tmp_path / "out").glob("shard-*"))


def test_bad_dataset_exits_2_naming_file_and_line(tmp_path):
    data = tmp_path / "p.txt"
    data.write_bytes(b"ok\r" + b"x" * 3000 + b"\rfine\r")
    text = refused(f"dataset.path={data}", "dataset.max_line_bytes=1000", f"output_dir={tmp_path / 'out'}", *FAST)
    assert f"{data}:2: line longer than 1000 bytes (dataset.max_line_bytes)" in text
    assert "dataset.on_error=skip" in text


def test_a_side_the_pipeline_refuses_is_a_user_error(tmp_path):
    """SanaPipeline.check_inputs wants sides divisible by 32, though the tiny preset's VAE and patch
    need only 4: the preset's divisor includes the pipeline's rule, so 72 is refused up front."""
    data = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a"}])
    text = refused(*_without(FAST, "sampling.height=72"), f"dataset.path={data}", f"output_dir={tmp_path / 'out'}", "sampling.height=72")
    assert "sampling.height=72 is not a multiple of 32" in text and "use 64" in text


def test_a_value_error_inside_diffusers_is_a_crash_with_its_traceback(tmp_path):
    """A ValueError raised inside diffusers (here: building the tiny VAE with an activation it does
    not know) is a bug to report (exit 1, traceback), not a user error to hide behind exit 2."""
    data = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a"}])
    proc = cli(f"dataset.path={data}", f"output_dir={tmp_path / 'out'}", "sampling.steps=2",
               "model.tiny.weights=random", "model.tiny.vae.decoder_act_fns=bogus", "job.progress=false")
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, log_of(proc)
    assert "Traceback" in text and "ValueError: activation function bogus not found" in text


def test_a_break_policy_name_no_module_has_is_a_user_error(tmp_path):
    """Module names can only be checked against the loaded model: refused then, naming what matches."""
    data = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a"}])
    text = refused(f"dataset.path={data}", f"output_dir={tmp_path / 'out'}", "model.break_policy=[attn9]", *FAST)
    assert "model.break_policy names ['attn9'] match no module of SanaTransformer2DModel" in text
    assert "SanaTransformerBlock" in text  # a class name that would match
