"""SANA / SANA1.5 (diffusers `SanaPipeline`, `SanaTransformer2DModel`, `AutoencoderDC`).

Encoding follows `SanaPipeline.encode_prompt` exactly (lower-case, right padding to
max_sequence_length, the optional complex-human-instruction prefix and its select index), so the
plan's text lengths match what the pipeline produces; the padder then re-cuts the 300-long
embeddings to the text bucket.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

from jobs.config import ModelConfig
from jobs.models import demo_weights, text_encoders, text_positions
from jobs.models.base import DenoiseRequest, ModelFamily, TextLength, cpu_generators
from jobs.models.registry import register_family
from jobs.models.tiny import build_scheduler
from padding import TextEmbeds

if TYPE_CHECKING:
    import torch


class SanaFamily(ModelFamily):
    name = "sana"
    pipeline_class = "SanaPipeline"

    # -- loading ---------------------------------------------------------------------------
    def build_tiny(self, cfg: ModelConfig, dtype: torch.dtype):
        import torch
        from diffusers import AutoencoderDC, SanaPipeline, SanaTransformer2DModel

        tiny = cfg.tiny
        assert tiny is not None  # preflight refuses model.path=None without a tiny section
        self.check_tiny(cfg)
        torch.manual_seed(int(tiny.seed))  # the same preset gives the same weights everywhere
        transformer = SanaTransformer2DModel(**tiny.transformer)
        vae = AutoencoderDC(**tiny.vae)
        if demo_weights.mode(tiny) == demo_weights.TRAINED:
            # The ignores: mypy types diffusers' top-level exports as their dummy placeholder classes (a stub gap).
            demo_weights.load("transformer", transformer)  # type: ignore[arg-type]  # stub gap
            demo_weights.load("vae", vae)  # type: ignore[arg-type]  # stub gap
        scheduler = build_scheduler(tiny.scheduler)
        pipe = SanaPipeline(
            tokenizer=text_encoders.load_tokenizer(tiny.text_encoder),
            text_encoder=text_encoders.load_text_encoder(
                tiny.text_encoder, tiny.text_encoder_weights or "pretrained", int(tiny.seed)),
            transformer=transformer,
            vae=vae,
            scheduler=scheduler,
        )
        return self.prepare_tiny(pipe, cfg, dtype)

    def check_tiny(self, cfg: ModelConfig) -> None:
        assert cfg.tiny is not None  # preflight checks the tiny section only where there is one
        demo_weights.check_sana_tiny(cfg.tiny)

    def load_tokenizer(self, cfg: ModelConfig):
        if cfg.path is None:  # the tiny preset names its encoder by a string (minilm or a folder)
            assert cfg.tiny is not None  # preflight refuses model.path=None without a tiny section
            return text_encoders.load_tokenizer(cfg.tiny.text_encoder)
        return super().load_tokenizer(cfg)

    def text_length_limit(self, cfg: ModelConfig) -> Optional[Tuple[int, str]]:
        # Gemma-2 (the real checkpoints) has rotary positions: no limit. An encoder with learned absolute
        # positions (the tiny preset's MiniLM, a BERT) has max_position_embeddings of them, and the
        # instruction prefix takes its tokens - 2 of them (encode_prompt's max_length_all).
        where, config = self.text_encoder_config(cfg)
        positions = None if config is None else text_positions.position_limit(config)
        if positions is None:
            return None
        why = f"{cfg.name}'s text encoder ({where}) has {positions} learned positions"
        if not cfg.complex_human_instruction:
            return positions, why
        taken = len(self.load_tokenizer(cfg).encode("\n".join(cfg.complex_human_instruction))) - 2
        return positions - taken, f"{why}, and model.complex_human_instruction takes {taken} of them"

    def text_encoder_config(self, cfg: ModelConfig) -> Tuple[str, Optional[dict]]:
        """(where it is, the text encoder's config): the checkpoint's config.json, or the tiny preset's encoder
        (a name or folder, as SANA's tiny preset names it, or a section with a class_name)."""
        if cfg.path is None:
            assert cfg.tiny is not None  # preflight refuses model.path=None without a tiny section
            spec = cfg.tiny.text_encoder
            if not isinstance(spec, str):
                return f"model.tiny.text_encoder: {spec['class_name']}", {"class_name": spec["class_name"],
                                                                           **spec["config"]}
            folder = text_encoders.resolve_encoder_path(spec)
        else:
            folder = os.path.join(cfg.path, "text_encoder")
        return os.path.join(folder, "config.json"), text_positions.encoder_config(folder)

    def spatial_divisor(self, cfg: ModelConfig) -> int:
        vae, tr = self.component_config(cfg, "vae"), self.component_config(cfg, "transformer")
        vae_scale = 2 ** (len(vae["encoder_block_out_channels"]) - 1)
        # SanaPipeline.check_inputs refuses sides that are not multiples of 32, whatever the VAE
        # (the tiny preset's VAE downsamples only 4x).
        return math.lcm(vae_scale * int(tr.get("patch_size", 1)), 32)

    # -- text ------------------------------------------------------------------------------
    def text_lengths(self, tokenizer, prompts: Sequence[str], cfg: ModelConfig, instruction: bool) -> List[TextLength]:
        limit = cfg.max_sequence_length
        chi = cfg.complex_human_instruction if instruction else None
        texts = [p.lower().strip() for p in prompts]
        if not chi:
            raw = [len(ids) for ids in tokenizer(texts, add_special_tokens=True)["input_ids"]]
            return [TextLength(used=max(1, min(n, limit)), raw=n, limit=limit) for n in raw]
        # With the instruction prefix the pipeline tokenizes prefix+prompt to
        # n_chi + limit - 2 positions, then keeps position 0 and the last limit-1 positions.
        prefix = "\n".join(chi)
        n_chi = len(tokenizer.encode(prefix))
        total = n_chi + limit - 2
        raw = [len(ids) for ids in tokenizer([prefix + t for t in texts], add_special_tokens=True)["input_ids"]]
        out = []
        for n in raw:
            real = min(n, total)
            tail_start = total - (limit - 1)  # first kept position of the tail
            used = 1 + max(0, real - tail_start)
            out.append(TextLength(used=used, raw=n - n_chi, limit=limit))
        return out

    def text_length_arrays(self, tokenizer, prompts, cfg: ModelConfig, instruction: bool):
        """text_lengths without the instruction prefix, for a tokenizer that counts Arrow arrays
        (the planner's LengthTokenizer): `p.lower().strip()` in Arrow where it is ASCII."""
        counts = getattr(tokenizer, "counts_array", None)
        if (counts is None or (instruction and cfg.complex_human_instruction)
                or type(self).text_lengths is not SanaFamily.text_lengths):  # a subclass's own rule
            return super().text_length_arrays(tokenizer, prompts, cfg, instruction)
        import numpy as np

        raw = counts(_lower_strip(prompts), add_special_tokens=True)
        limit = cfg.max_sequence_length
        return np.maximum(1, np.minimum(raw, limit)), raw, np.full(len(raw), limit, np.int64)

    def encode(self, pipe, prompts: Sequence[str], cfg: ModelConfig, device, instruction: bool) -> TextEmbeds:
        # Always at the native max_sequence_length, then cut to the bucket (padding/bucket.py), even
        # for the tiny preset's MiniLM: encoding at the bucket length is not the same computation.
        # Measured on a 2-core AVX2 CPU (torch 2.13): at 64 and 128 the masked encoder's real
        # positions matched the 300-token encoding bit for bit, at 256 already its first layer
        # did not (1e-5; SDPA and eager attention alike): the kernels' reduction order follows the
        # sequence length, so equality would be an accident of one machine, not a property.
        embeds, mask, _, _ = pipe.encode_prompt(
            list(prompts),
            do_classifier_free_guidance=False,
            device=device,
            max_sequence_length=cfg.max_sequence_length,
            complex_human_instruction=cfg.complex_human_instruction if instruction else None,
        )
        return TextEmbeds(embeds=embeds, mask=mask)

    # -- denoise + decode ------------------------------------------------------------------
    denoise_output = "latent"

    def decode(self, pipe, latents: torch.Tensor, request: DenoiseRequest) -> torch.Tensor:
        # SanaPipeline.__call__'s own decode and postprocess(output_type="pt"), op for op, so the
        # staged path gives the serial path's bytes (tests/test_stages.py).
        latents = latents.to(pipe.vae.dtype)
        image = pipe.vae.decode(latents / pipe.vae.config.scaling_factor, return_dict=False)[0]
        return pipe.image_processor.postprocess(image, output_type="pt")

    def warmup_latents(self, pipe, size: int, height: int, width: int, num_frames: int, device,
                       generator: torch.Generator) -> Optional[torch.Tensor]:
        # SanaPipeline.__call__'s latents: float32, the transformer's in_channels, the VAE's scale.
        import torch

        f = pipe.vae_scale_factor
        shape = (size, pipe.transformer.config.in_channels, height // f, width // f)
        return torch.randn(shape, generator=generator, device=device, dtype=torch.float32)

    def pipeline_kwargs(self, request: DenoiseRequest) -> dict:
        pos, neg = request.positive, request.negative
        cfg_on = neg is not None
        return dict(
            negative_prompt=None,
            prompt_embeds=pos.embeds,
            prompt_attention_mask=pos.mask,
            negative_prompt_embeds=neg.embeds if neg is not None else None,
            negative_prompt_attention_mask=neg.mask if neg is not None else None,
            guidance_scale=request.guidance_scale if cfg_on else 1.0,
            num_inference_steps=request.steps,
            height=request.height,
            width=request.width,
            generator=cpu_generators(request.seeds),
            use_resolution_binning=False,  # the plan validated the size; binning would resize
        )


_ASCII_SPACE = " \t\n\x0b\x0c\r\x1c\x1d\x1e\x1f"  # what str.strip() strips of ASCII


def _lower_strip(arr):
    """`[p.lower().strip() for p in arr]` as an Arrow array: Arrow's ASCII kernels give Python's
    answer on ASCII strings; the others go through Python."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    out = pc.ascii_trim(pc.ascii_lower(arr), _ASCII_SPACE)
    other = np.flatnonzero(~pc.string_is_ascii(arr).to_numpy(zero_copy_only=False))
    if len(other):
        fixed = [p.lower().strip() for p in arr.take(pa.array(other)).to_pylist()]
        mask = np.zeros(len(arr), bool)
        mask[other] = True
        out = pc.replace_with_mask(out, pa.array(mask), pa.array(fixed, pa.string()))
    return out


register_family(SanaFamily())
