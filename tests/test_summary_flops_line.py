"""The closing summary's model FLOPs line (jobs/telemetry/summary.py): counted, its rate and its share of the
peak; not counted, the reason."""

from __future__ import annotations

from jobs.models.flops import flops_summary_mix
from jobs.plan import Signature
from jobs.telemetry.summary import JobStats

WAN_TINY = dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4, text_dim=16,
                freq_dim=16, ffn_dim=32, num_layers=1)


def _line(flops: dict) -> str:
    return next(line for line in JobStats(flops=flops).lines() if "model FLOPs" in line)


def test_a_counted_family_says_its_flops_a_sample_however_small_the_rate():
    sig = Signature(height=32, width=32, text_bucket=8, steps=2, guidance_scale=1.0, cfg=False, dtype="float32",
                    frames=5)
    tiny_on_a_cpu = flops_summary_mix("wan", {sig: 2}, 5.0, transformer_config=WAN_TINY)
    assert tiny_on_a_cpu["counted"] and tiny_on_a_cpu["tflops"] == 0.0
    per = tiny_on_a_cpu["flops_per_image"]
    assert _line(tiny_on_a_cpu) == f"  model FLOPs: {per:.3g} a sample, under 0.01 TFLOP/s while generating"
    gpu = dict(tiny_on_a_cpu, tflops=441.8, peak_tflops=989.0, peak_fraction=0.4467)
    assert _line(gpu) == (f"  model FLOPs: {per:.3g} a sample, 441.8 TFLOP/s while generating = 45% of the GPU's "
                          f"dense bf16 peak (989)")


def test_a_family_without_a_rule_says_why():
    sig = Signature(height=32, width=32, text_bucket=8, steps=2, guidance_scale=1.0, cfg=False, dtype="float32")
    out = flops_summary_mix("no_such_family", {sig: 1}, 1.0, transformer_config={})
    assert _line(out) == "  model FLOPs: " + out["reason"]
    assert _line({}) == "  model FLOPs: not counted"
