"""Fusion rules by name: each rule is a module pattern (class name + a check) and a forward maker.

A rule's forward replaces one module's `forward` as an instance attribute (model code is never
edited); `bcg.fusions.install_fusions` walks the model and applies every rule whose class matches
and whose check passes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import nn

from .verify import Verifier


@dataclass(frozen=True)
class Rule:
    name: str
    target: str
    """Class name of the modules the rule applies to, or `module.ClassName` for a name other libraries
    use too (DC-AE's `ResBlock`, `Decoder`): modules of another class are not the rule's business, so
    they are not reported as skipped."""
    check: Callable[[nn.Module], "str | None"]
    """Why a matching module cannot take the rule (None: it can)."""
    make_forward: Callable[[nn.Module, Verifier], "Callable | dict[str, Callable]"]
    """The module's new forward, or {child name: forward} for a rule that swaps children's
    forwards (sana_prompt: the model's caption path)."""
    ops: tuple[str, ...]
    """The fused chains the forward uses (ops.OPS names)."""


RULES: dict[str, Rule] = {}


def register(rule: Rule) -> Rule:
    if rule.name in RULES:
        raise ValueError(f"fusion rule {rule.name!r} is already registered (known: {sorted(RULES)})")
    RULES[rule.name] = rule
    return rule


def get(name: str) -> Rule:
    if name not in RULES:
        raise ValueError(f"unknown fusion rule {name!r}; known: {', '.join(sorted(RULES))}")
    return RULES[name]


def _builtin() -> None:
    from . import (
        dc_ae,
        flux,
        glm_image,
        ltx2,
        ltx2_prompt,
        minimax_h3,
        ops_norm,
        qwen_image,
        sana,
        sana_video,
        wan,
        z_image,
    )

    register(Rule("sana_prompt", "SanaTransformer2DModel", sana.check_prompt, sana.prompt_forwards, ()))
    register(Rule("sana_block", "SanaTransformerBlock", sana.check_block, sana.block_forward,
                  ("modulation", "adaln", "linear_attention_fma", "linear_attention", "gated_residual_linear",
                   "gated_residual", "rescale_residual", "conv_bias_silu", "conv_bias_glu", "glu", "dwconv_glu_rows",
                   "dwconv_glu_cols", "silu_dwconv_glu") + ops_norm.OP_NAMES))
    register(Rule("z_image_block", "ZImageTransformerBlock", z_image.check_block, z_image.block_forward,
                  (*(op.name for op in z_image.RMS_VARIANCE), "rms_norm_scale",
                   *(op.name for op in z_image.NORM_ROPE_IN), *(op.name for op in z_image.NORM_ROPE),
                   "gated_rms_residual", "swiglu")))
    register(Rule("qwen_image_block", "QwenImageTransformerBlock", qwen_image.check_block, qwen_image.block_forward,
                  qwen_image.OPS))
    register(Rule("sana_video_block", "SanaVideoTransformerBlock", sana_video.check_block, sana_video.block_forward,
                  sana_video.OPS))
    register(Rule("wan_prompt", "WanTransformer3DModel", wan.check_model, wan.prompt_forwards, ()))
    register(Rule("wan_block", "WanTransformerBlock", wan.check_block, wan.block_forward, wan.OPS))
    register(Rule("ltx2_prompt", "LTX2VideoTransformer3DModel", ltx2_prompt.check_model, ltx2_prompt.prompt_forwards,
                  ()))
    register(Rule("ltx2_block", "LTX2VideoTransformerBlock", ltx2.check_block, ltx2.block_forward, ltx2.OPS))
    register(Rule("glm_image_block", "GlmImageTransformerBlock", glm_image.check_block, glm_image.block_forward,
                  glm_image.OPS))
    register(Rule("glm_image_norm_out", "GlmImageAdaLayerNormContinuous", glm_image.check_norm_out,
                  glm_image.norm_out_forward, glm_image.NORM_OUT_OPS))
    register(Rule("minimax_h3_block", "MiniMaxH3TransformerBlock", minimax_h3.check_block, minimax_h3.block_forward,
                  minimax_h3.OPS))
    register(Rule("minimax_h3_norm_out", "MiniMaxH3AdaLayerNormOut", minimax_h3.check_norm_out,
                  minimax_h3.norm_out_forward, minimax_h3.NORM_OUT_OPS))
    for prefix in flux.FAMILIES:  # Flux.1 and LongCat-Image: one forward each for both block kinds
        name = prefix.lower()
        register(Rule(f"{name}_block", f"{prefix}TransformerBlock", flux.check_block, flux.block_forward, flux.OPS))
        register(Rule(f"{name}_single_block", f"{prefix}SingleTransformerBlock", flux.check_single,
                      flux.single_forward, flux.OPS))
    # SANA's DC-AE decoder (the worker installs the tier on the VAE too: jobs/worker/model.py)
    var = tuple(op.name for op in dc_ae.RMS_VARIANCE)
    for name, cls, check, forward, ops in (
            ("dc_ae_resblock", "ResBlock", dc_ae.check_resblock, dc_ae.resblock_forward,
             ("conv_bias_silu", "channel_rms", *var)),
            ("dc_ae_up_block", "DCUpBlock2d", dc_ae.check_up_block, dc_ae.up_block_forward,
             ("up_nearest", "up_shortcut")),
            ("dc_ae_decoder", "Decoder", dc_ae.check_decoder, dc_ae.decoder_forward, ("channel_rms", *var)),
            ("dc_ae_efficientvit", "EfficientViTBlock", dc_ae.check_efficientvit, dc_ae.efficientvit_forward,
             ("conv_bias_silu", "conv_bias_glu", "channel_rms", *var))):
        register(Rule(name, dc_ae.qualified(cls), check, forward, ops))


_builtin()
