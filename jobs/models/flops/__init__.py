"""Model FLOPs of a family's transformer per image, counted from its config and the plan's signature.

    flops = transformer_flops("sana", transformer_config, vae_config, signature)   # None: not counted
    flops_summary("sana", signature, images=510, seconds=167.7,
                  transformer_config=..., vae_config=...)   # {"tflops": ..., "peak_fraction": ...}
    flops_summary_mix("sana", {sig_a: 452, sig_b: 58}, 167.7, transformer_config=..., vae_config=...)

What is counted is what `torch.utils.flop_counter.FlopCounterMode` counts: matmuls (2 FLOPs per
multiply-add), convolutions and attention's two products; elementwise ops, norms and softmax are
not (they are memory-bound and a few percent of the FLOPs). Each rule equals the counter on tiny
real diffusers models (tests/test_flops.py for SANA and Flux, tests/test_flops_<family>.py for the
others), and over a whole tiny job of every family (tests/test_flops_job.py). The count is the
model's work: an engine that skips work (bcgen's prompt memo makes SANA's caption projection and
cross-attention K/V once per prompt batch, not once per step) does fewer FLOPs for the same image,
and its achieved TFLOP/s is stated against the model's count, as MFU is.

Families register a rule by name, one module a family here, on the mechanism of base.py; an
unknown name gives None, which callers report as "not counted". Peak: the board's dense bf16
(base.DENSE_BF16_TFLOPS: H200 and H100 SXM 989 TFLOP/s datasheet, about 790 measured on a large GEMM).
"""

from jobs.models.flops import (  # noqa: F401 - each module registers its family's rule
    flux,
    glm_image,
    longcat_image,
    ltx2,
    minimax_h3,
    qwen_image,
    sana,
    sana_video,
    wan,
    z_image,
)
from jobs.models.flops.base import (
    DENSE_BF16_TFLOPS,
    H200_BF16_DENSE_TFLOPS,
    FlopCount,
    dense_bf16_peak,
    flops_summary,
    flops_summary_mix,
    known_families,
    register_flops,
    transformer_flops,
)

__all__ = ["DENSE_BF16_TFLOPS", "H200_BF16_DENSE_TFLOPS", "FlopCount", "dense_bf16_peak", "flops_summary",
           "flops_summary_mix", "known_families", "register_flops", "transformer_flops"]
