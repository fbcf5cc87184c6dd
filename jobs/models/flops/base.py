"""What a FLOP count is, the rules' registry, and the summaries a job reports (jobs/models/flops/).

The mechanism every family's rule shares: FlopCount (one forward of one image row, split into the
latent part and the prompt part), register_flops / transformer_flops (a rule by family name), the
GPU's peak, and the summaries (TFLOP/s over a generate stage, the fraction of the peak). The rules
themselves are the package's other modules, one a family.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional

H200_BF16_DENSE_TFLOPS = 989.0


@dataclass(frozen=True)
class FlopCount:
    """FLOPs of one transformer forward for one image row (one CFG branch), split by what depends
    on the prompt alone (made once per prompt by an engine that memoizes it) and what does not."""

    per_forward_image: float  # every step: the latent path
    per_forward_prompt: float  # every step in the model, once per prompt with a prompt memo
    steps: int
    rows: int  # transformer rows per image and step: 2 with classifier-free guidance (LTX-2: 4, its calls' mean)

    @property
    def per_forward(self) -> float:
        return self.per_forward_image + self.per_forward_prompt

    @property
    def per_image(self) -> float:
        """The model's FLOPs for one image: every step, every CFG branch."""
        return self.steps * self.rows * self.per_forward

    @property
    def per_image_with_prompt_memo(self) -> float:
        """What an engine that makes the prompt part once per image computes."""
        return self.rows * (self.steps * self.per_forward_image + self.per_forward_prompt)


Rule = Callable[[dict, Optional[dict], object], FlopCount]
_RULES: Dict[str, Rule] = {}


def register_flops(family: str):
    def wrap(rule: Rule) -> Rule:
        if family in _RULES:
            raise ValueError(f"a FLOPs rule for {family!r} is registered already")
        _RULES[family] = rule
        return rule

    return wrap


def known_families() -> list:
    return sorted(_RULES)


def transformer_flops(
    family: str, transformer_config: dict, vae_config: Optional[dict], signature
) -> Optional[FlopCount]:
    """The family's count for `signature` (jobs.plan.Signature: height, width, text_bucket, steps,
    cfg), or None where the family has no rule."""
    rule = _RULES.get(family)
    return None if rule is None else rule(transformer_config, vae_config, signature)


# Dense bf16 TFLOP/s by the GPU's name (datasheets), the first name found in the device's wins: so the
# H100's PCIe and NVL boards (lower clocks and power) come before the SXM board's plain "H100"
# ("NVIDIA H100 80GB HBM3"). Where no name is found, no fraction is claimed.
DENSE_BF16_TFLOPS = {"H200": 989.0, "H100 PCIe": 756.0, "H100 NVL": 835.0, "H100": 989.0, "A100": 312.0,
                     "B200": 2250.0}


def dense_bf16_peak(device) -> Optional[float]:
    """The datasheet dense bf16 peak of `device`'s GPU, or None (a CPU, or a GPU not in the table)."""
    import torch

    if getattr(device, "type", str(device)) != "cuda":
        return None
    return peak_by_name(torch.cuda.get_device_name(device))


def peak_by_name(name: str) -> Optional[float]:
    """DENSE_BF16_TFLOPS's entry for a GPU named `name` (torch.cuda.get_device_name), or None."""
    return next((v for k, v in DENSE_BF16_TFLOPS.items() if k in name), None)


def flops_summary(family: str, signature, images: int, seconds: float, *, transformer_config: dict,
                  vae_config: Optional[dict] = None, peak_tflops: float = H200_BF16_DENSE_TFLOPS) -> dict:
    """What a summary reports: model FLOPs per image, achieved TFLOP/s over `seconds` for `images`
    images of `signature`, and the fraction of the peak; {"counted": False, ...} without a rule."""
    return flops_summary_mix(family, {signature: images}, seconds, transformer_config=transformer_config,
                             vae_config=vae_config, peak_tflops=peak_tflops)


def flops_summary_mix(family: str, images_by_signature: dict, seconds: float, *, transformer_config: dict,
                      vae_config: Optional[dict] = None, peak_tflops: float = H200_BF16_DENSE_TFLOPS) -> dict:
    """flops_summary of a run of several signatures ({Signature: images}) in `seconds` (a job's
    generation stage): FLOPs per image is the run's mean."""
    found = {sig: transformer_flops(family, transformer_config, vae_config, sig) for sig in images_by_signature}
    counts = {sig: c for sig, c in found.items() if c is not None}
    if not found or len(counts) < len(found):
        return {"counted": False, "reason": f"not counted: no FLOPs rule for family {family!r} "
                                            f"(known: {', '.join(known_families())})"}
    images = sum(images_by_signature.values())
    total = sum(c.per_image * images_by_signature[sig] for sig, c in counts.items())
    memo = sum(c.per_image_with_prompt_memo * images_by_signature[sig] for sig, c in counts.items())
    tflops = total / seconds / 1e12 if seconds > 0 and images else None
    return {"counted": True, "flops_per_image": total / images if images else None,
            "flops_per_image_with_prompt_memo": memo / images if images else None,
            "tflops": None if tflops is None else round(tflops, 2), "peak_tflops": peak_tflops,
            "peak_fraction": None if tflops is None else round(tflops / peak_tflops, 4)}


# -- what the rules share ----------------------------------------------------------------------
def linear(tokens: int, fan_in: int, fan_out: int) -> float:
    """A linear layer over `tokens` rows: 2 FLOPs per multiply-add, as the counter counts (bias not)."""
    return 2.0 * tokens * fan_in * fan_out


def vae_scale_dc(vae_config: Optional[dict], default: int) -> int:
    """Pixels per latent side: 2 ** (stages - 1) for an encoder that halves at each stage but the first."""
    if not vae_config or "encoder_block_out_channels" not in vae_config:
        return default
    return 2 ** (len(vae_config["encoder_block_out_channels"]) - 1)


def get(config: dict, name: str, default):
    """A config value, or the class's default (`default`) where the config has none or null."""
    value = config.get(name)
    return default if value is None else value


def vae_scale_kl(vae_config: Optional[dict], default: int) -> int:
    """AutoencoderKL: it halves the size at every block but the last."""
    if not vae_config or "block_out_channels" not in vae_config:
        return default
    return 2 ** (len(vae_config["block_out_channels"]) - 1)
