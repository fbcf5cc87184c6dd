"""bcg.fusions: bit-exact fused kernels for the elementwise chains of diffusion transformers.

Quality tiers (`RunnerConfig.fusions`):
    "lossless"  (default) fused Triton kernels where the verifier found them bit-exact with eager
    "fast"      the torch.compile'd forward (`RunnerConfig.compile`): fewer kernels, not eager's bits
    "off"       the model's own forward

    fx = install_fusions(model)            # a hook on each matching module (bcg/hooks.py)
    ... model(...) ...                     # warm-up forwards verify each (op, shape) on first sight
    fx.stats()                             # counters for summary.json
    fx.remove()                            # the model's own forwards again

Layout, by pattern (each kernel written once, bound to a family's modules by its rule):
    applicable       NotApplicable: a plan does not cover these inputs (eager runs)
    ops*, kernels*   chains (eager / reference plan / fused launcher) and their Triton kernels:
                     ops, kernels            adaLN, gated residuals, SANA's linear attention and GLUMBConv
                     ops_norm, kernels_norm  LayerNorm (+ residual) + adaLN, in aten's Welford order
                     ops_rms, kernels_rms    RMSNorm in aten's orders, and the chains after it (scale, adaLN)
                     kernels_rope            q/k (RMSNorm +) RoPE, 1-D / 2-D / 3-D, interleaved or split
                                             pairs, shared or per-head frequencies, into joint attention
                     ops_act, kernels_act    SwiGLU, GELU-tanh
                     kernels_linear          SANA's linear attention, its fp32 products as FMA chains
                     ops_channel, kernels_channel  DC-AE's per-channel chains (RMSNorm over channels,
                                             the up block's shortcut, nearest x2)
    verify, guard    first-sight verification of chains and of whole rewritten forwards
    keys, cache      what decides bits; verdicts kept across runs
    registry         rules: module pattern + forward maker
    sana, sana_prompt, z_image, ltx2, ltx2_prompt, glm_image, minimax_h3, ...   the families' rules
Patterns and the families that bind them (one kernel each, parameterised by width, dtype, layout):

    pattern                                   kernel                      families
    LayerNorm (+ residual / gated residual)   kernels_norm.ln_adaln        SANA, SANA-Video, Flux, LongCat,
      + x * (1 + scale) + shift                 (bf16 plan; fp32 plan)     Qwen-Image, GLM-Image; Wan (fp32)
    gated residual  x + gate * y              kernels.gated_residual       all of the above (Wan: fp32), LTX-2,
                                                                           MiniMax-H3 (per-row, batch 1)
    adaLN  x * (1 + scale) + shift            kernels.adaln                SANA, LTX-2.3 (text K/V); MiniMax-H3
                                                                           (per-row, batch 1, after aten's
                                                                           torch.nn.RMSNorm)
    RMSNorm (+ * scale, + adaLN,              kernels_rms                  Z-Image; LTX-2 (adaLN, no weight)
      + gated residual)
    q/k RMSNorm + RoPE (1-D, 2-D, 3-D),       kernels_rope.rope            Z-Image, Qwen-Image (complex);
      into joint attention's concatenation                                 Flux, LongCat, Wan (real pairs);
                                                                           LTX-2 (split or real pairs);
                                                                           GLM-Image (split, after aten's
                                                                           per-head LayerNorm, once a half);
                                                                           MiniMax-H3 (each head's leading
                                                                           channels: split in fp32, real
                                                                           pairs of a copy in bf16)
    GELU-tanh (+ its cat), SwiGLU             kernels_act                  Flux / LongCat single; Z-Image
    per-block modulation precompute           modulation.TableStack/SameInput  SANA, SANA-Video, Wan, LTX-2;
                                                                               Flux, Qwen
    prompt memo (text K/V once a batch)       prompt.PromptState + bcg.memo    SANA, Wan, LTX-2.0

What the H200 has proven (benchmarks/results/): the LN kernel's Welford order and rsqrt form
(ln_diagnosis_h200.json), aten's mean order `vec_dec` for rows of 3840 and 128, libdevice rsqrt ==
torch.rsqrt, the complex product's fma_ac_ad contraction, expf-based SiLU, SANA's and Z-Image's chains
and whole forwards. Not yet run on a GPU (each guarded by the verifier, with an aten fallback): the
new families' rules, the RoPE kernel's real-pair style and joint slices, aten's fused RMSNorm order
(torch.nn.RMSNorm: Flux, LongCat, Wan, LTX-2), GELU-tanh's contraction, the affine LayerNorm's FMA, the
fp32 (Wan) plan of the LN kernel, and LTX-2's: the RMSNorm + adaLN kernel without a weight, aten's mean
order at rows of 4096 and 2048, the split RoPE's contraction (aten's CUDA addcmul: `plain` expected); and
GLM-Image's rule (the LN kernel at rows of 2560, the split RoPE at heads of 40 into the image slice of
aten's per-head LayerNorm: eager's rotation is separate mul / mul / add kernels, `plain` expected); and
MiniMax-H3's rule (adaLN and gated residuals on per-row [S, 1, D] views at rows of 5376, the split RoPE on
the leading 96 channels of heads of 128 in fp32, `plain` expected; the real-pair kernel with bf16 tables).

A rule only reorganises *which* calls run; every arithmetic op keeps eager's fp32-then-round plan,
and LayerNorm, GEMMs, convs and attention stay aten's. The verifier guards the rest: a chain that
is not equal to eager on live inputs runs eager for good, and the count says so.
"""

from __future__ import annotations

import logging
from typing import Callable

from torch import nn

from ..hooks import Chain, Replace
from ..rewrites import register_rewrite
from .ops import OPS, Op
from .registry import RULES, Rule
from .verify import BACKENDS, FusionCounters, Verifier

log = logging.getLogger(__name__)


def triton_available() -> str | None:
    """None if Triton imports, else why not."""
    try:
        import triton  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        return f"triton is not importable ({type(exc).__name__})"
    return None


def hook_name(rule: str) -> str:
    """The hook a rule's forward is installed as (bcg/hooks.py)."""
    return f"bcg.fusion.{rule}"


class Fusions:
    """Fusions installed on one model: the swapped forwards, the verifier and its counters."""

    def __init__(self, model: nn.Module, backend: str, reason: str = "") -> None:
        self.model = model
        self.verifier = Verifier(backend)
        self.reason = reason
        self.installed: list[tuple[str, nn.Module, Callable]] = []  # (rule, module, its fused forward)
        self.skipped: dict[str, int] = {}

    def install(self, rules: list[Rule] | None = None) -> "Fusions":
        rules = list(RULES.values()) if rules is None else rules
        by_target = {r.target: r for r in rules}
        for _qname, sub in self.model.named_modules():
            cls = type(sub)  # a rule names its class by name, or by module and name where the name is common
            rule = by_target.get(f"{cls.__module__}.{cls.__qualname__}") or by_target.get(cls.__name__)
            if rule is None:
                continue
            why = rule.check(sub)
            if why is not None:
                self.skipped[why] = self.skipped.get(why, 0) + 1
                continue
            made = rule.make_forward(sub, self.verifier)
            for child, fwd in (made.items() if isinstance(made, dict) else [("", made)]):
                target = sub.get_submodule(child) if child else sub
                Chain.of(target).add(hook_name(rule.name), Replace(fwd))
                self.installed.append((rule.name, target, fwd))
        for why, n in self.skipped.items():
            log.warning("bcg.fusions: %d module(s) keep their forward: %s", n, why)
        log.info("bcg.fusions: %d forward(s) fused (%s backend)", len(self.installed), self.verifier.backend)
        return self

    def remove(self) -> int:
        """Restore every swapped forward; returns how many were restored."""
        n = sum(Chain.of(sub).remove(hook_name(rule)) for rule, sub, _ in reversed(self.installed))
        self.installed.clear()
        return n

    @property
    def counters(self) -> FusionCounters:
        return self.verifier.counters

    def stats(self) -> dict:
        d = {"tier": "lossless", "backend": self.verifier.backend, "modules": len(self.installed)}
        if self.reason:
            d["reason"] = self.reason
        d.update(self.counters.as_dict())
        return d


def install_fusions(model: nn.Module, backend: str = "triton", rules: list[str] | None = None) -> Fusions:
    """Install the lossless fusions on `model`. backend "triton": the GPU kernels (the runner
    installs them only on its CUDA backend); "reference": the plain-torch plans (CPU tests)."""
    if backend not in BACKENDS:
        raise ValueError(f"fusion backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    chosen = None if rules is None else [registry_get(n) for n in rules]
    return Fusions(model, backend).install(chosen)


def registry_get(name: str) -> Rule:
    from .registry import get

    return get(name)


def _install_lossless(model: nn.Module) -> Fusions | None:
    """The "lossless" tier's rewrite (bcg/rewrites.py): the Triton kernels, where Triton imports."""
    why = triton_available()
    if why is not None:
        log.warning("bcg: fusions=lossless needs Triton (%s); the model keeps its own forward", why)
        return None
    return install_fusions(model, backend="triton")


register_rewrite("lossless", _install_lossless)

__all__ = ["Fusions", "FusionCounters", "OPS", "Op", "RULES", "Rule", "Verifier", "install_fusions",
           "triton_available"]
