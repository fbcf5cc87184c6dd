"""GLM-Image (diffusers `GlmImagePipeline`: an autoregressive prior, `GlmImageForConditionalGeneration`,
then the DiT `GlmImageTransformer2DModel`, `AutoencoderKL`, a T5 glyph encoder).

Two models per image. The AR prior reads the prompt and generates image tokens (a 1/32 grid plus a
small preview grid, sampled); the DiT denoises the latents conditioned on those tokens (upsampled
2x) and on the glyph embeddings of the prompt's quoted text.

- The prior runs eagerly in the encode stage (`row_inputs`), so it overlaps the previous batch's
  denoising (jobs/worker/scheduler.py), once per prompt (batch 1, so a prompt's tokens do not depend on its
  batch), seeded from the row's seed exactly as the pipeline seeds it (`generate_prior_tokens`
  seeds the global torch RNG: nothing else in a GLM-Image job draws from it, and the encode stage
  holds the engine's GPU lock, so no capture runs meanwhile). Its tokens go to the pipeline as
  `prior_token_ids`, and their sha256 (of the AR's own grid, int64 little-endian) and grid size
  go into the sample's json. Only the DiT is wrapped by the bcg runner (`ModelFamily.transformer`).
- Text: the glyph length policy is in padding/glm_image.py (native length, nothing padded). The
  unconditional branch is the pipeline's own (empty glyph text, prior tokens dropped), so
  `negative_prompt` is not used by this family.
- Graph-friendly calls (`patch`), each exact: the pipeline hands the DiT a fresh, idle KV cache
  object on every call (image-to-image only fills it), which would make every batch a new graph
  signature: an idle cache is passed as None, which the attention processor treats the same. The
  rotary table the DiT builds on the host on every call (then copies to the device inside the
  forward, which a CUDA graph would replay from a freed host buffer) is built once per grid and
  passed in on the device, the very values. And the forward's `prior_embedding[prior_token_drop]
  *= 0.0` (a boolean-mask index: a host sync no graph can capture) is rewritten to the equal
  `torch.where(drop, prior_embedding * 0.0, prior_embedding)`, in a same-named subclass of the
  DiT's class; see `capturable_forward`.

Sizes: multiples of 32 (the prior's grid is 1/32 of the image; `GlmImagePipeline.check_inputs`).
"""

from __future__ import annotations

import hashlib
import inspect
import re
import sys
import textwrap
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Sequence, Tuple

from jobs.config import ModelConfig
from jobs.models.base import DenoiseRequest, ModelFamily, RowInputs, TextLength, cpu_generators
from jobs.models.registry import register_family
from jobs.models.tiny import build_scheduler, tiny_text_encoder, tiny_tokenizer
from padding import TextEmbeds

if TYPE_CHECKING:
    import torch

AR_GRID = 32  # GlmImageProcessor._get_target_shape: the prior's tokens are a 1/32 grid of the image

# GlmImagePipeline.get_glyph_texts's patterns, copied: importing the pipeline module costs every
# planner process seconds. tests/test_family_glm_image.py checks the copy against the original.
_GLYPHS = (re.compile(r"'([^']*)'"), re.compile(r"\u201c([^\u201c\u201d]*)\u201d"), re.compile(r'"([^"]*)"'),
           re.compile(r"「([^「」]*)」"))

_DROP = "prior_embedding[prior_token_drop] *= 0.0"
_WHERE = "prior_embedding = torch.where(prior_token_drop.unsqueeze(-1), prior_embedding * 0.0, prior_embedding)"


def glyph_texts(prompt: str) -> List[str]:
    return [m for pattern in _GLYPHS for m in pattern.findall(prompt)]


def glyph_length(tokenizer, prompt: str, limit: int) -> Tuple[int, bool]:
    """(rows of glyph embeddings the pipeline makes for `prompt`, whether a span was cut at `limit`),
    as `_get_glyph_embeds` counts them: each span's tokens, plus one pad token per span when the
    number of spans is even (the pipeline pads by the span count's parity)."""
    texts = glyph_texts(prompt) or [""]
    ids = tokenizer(texts)["input_ids"]
    pad = (len(ids) + 1) % 2
    return sum(min(len(x), limit) + pad for x in ids), any(len(x) > limit for x in ids)


def capturable_forward(cls) -> Callable[..., Any]:
    """`cls.forward` with its one boolean-mask index replaced by the equal `torch.where`.

    Rewritten from the installed source rather than copied, so every other line stays diffusers'
    own. `x[mask] *= 0.0` computes `x[mask] * 0.0` and writes it back where mask is True; the
    `where` takes the same product there and `x` elsewhere: the same bits, with no host sync.
    tests/test_family_glm_image.py compares both forwards bit for bit."""
    source = textwrap.dedent(inspect.getsource(cls.forward))
    if source.count(_DROP) != 1:
        raise RuntimeError(f"{cls.__qualname__}.forward no longer has `{_DROP}` once; the GLM-Image family "
                           f"must be revisited for this diffusers version")
    namespace: Dict[str, Any] = {}
    code = compile(source.replace(_DROP, _WHERE), f"<bcgen: {cls.__qualname__}.forward, mask index as where>", "exec")
    exec(code, vars(sys.modules[cls.__module__]), namespace)  # noqa: S102 - diffusers' own source, one line changed
    return namespace["forward"]


_CAPTURABLE: Dict[type, type] = {}


def capturable_class(cls) -> type:
    """`cls` with `capturable_forward`: a subclass of the same name (what `save_pretrained` records),
    made once per class. A subclass, not an instance attribute: the bcg runner owns `module.forward`."""
    if getattr(cls, "_bcgen_capturable", False):
        return cls
    if cls not in _CAPTURABLE:
        _CAPTURABLE[cls] = type(cls.__name__, (cls,), {"forward": capturable_forward(cls), "_bcgen_capturable": True,
                                                       "__module__": cls.__module__, "__qualname__": cls.__qualname__})
    return _CAPTURABLE[cls]


class _GraphFriendlyCalls:
    """A forward pre-hook on the DiT (it runs before the bcg runner's wrapper): idle KV caches -> None,
    the rotary table built once per grid on the device (see the module docstring)."""

    def __init__(self) -> None:
        self._rope: Dict[tuple, Tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, module, args, kwargs):
        cache = kwargs.get("kv_caches")
        if cache is not None and all(c.mode is None and not c.k_caches for c in cache.caches):
            kwargs["kv_caches"] = None
        x = kwargs.get("hidden_states", args[0] if args else None)
        if kwargs.get("image_rotary_emb") is None and x is not None:
            key = (tuple(x.shape[-2:]), x.device)
            if key not in self._rope:
                cos, sin = module.rope(x)  # host tensors, as the forward builds them
                self._rope[key] = (cos.to(x.device), sin.to(x.device))
            kwargs["image_rotary_emb"] = self._rope[key]
        return args, kwargs


class GlmImageFamily(ModelFamily):
    name = "glm_image"
    pipeline_class = "GlmImagePipeline"
    components = ("transformer", "vae", "text_encoder", "tokenizer", "vision_language_encoder", "processor",
                  "scheduler")

    # -- loading ---------------------------------------------------------------------------
    def build_tiny(self, cfg: ModelConfig, dtype: torch.dtype):
        import torch
        import transformers
        from diffusers import AutoencoderKL, GlmImagePipeline, GlmImageTransformer2DModel
        from transformers import ByT5Tokenizer, GlmImageProcessor
        from transformers.models.glm_image.image_processing_pil_glm_image import GlmImageImageProcessorPil

        tiny = cfg.tiny
        assert tiny is not None  # preflight refuses model.path=None without a tiny section
        torch.manual_seed(int(tiny.seed))
        ar_spec = tiny.vision_language_encoder
        assert ar_spec is not None, "a GLM-Image tiny preset has model.tiny.vision_language_encoder"
        ar_tokenizer = tiny_tokenizer(ar_spec)
        config = transformers.GlmImageConfig(**dict(ar_spec["config"]),
                                             image_token_id=ar_tokenizer.convert_tokens_to_ids(ar_tokenizer.image_token))
        pipe = GlmImagePipeline(
            tokenizer=ByT5Tokenizer(),  # byte-level: the real glyph tokenizer, no vocabulary file
            processor=GlmImageProcessor(image_processor=GlmImageImageProcessorPil(), tokenizer=ar_tokenizer,
                                        chat_template=ar_spec["chat_template"]),
            text_encoder=tiny_text_encoder(tiny.text_encoder),
            vision_language_encoder=transformers.GlmImageForConditionalGeneration(config).eval(),
            vae=AutoencoderKL(**tiny.vae),
            transformer=GlmImageTransformer2DModel(**tiny.transformer),
            scheduler=build_scheduler(tiny.scheduler),
        )
        return self.prepare_tiny(pipe, cfg, dtype)

    def load_tokenizer(self, cfg: ModelConfig):
        if cfg.path is None:
            from transformers import ByT5Tokenizer

            return ByT5Tokenizer()
        return super().load_tokenizer(cfg)

    def patch(self, pipe) -> None:
        transformer = pipe.transformer
        transformer.__class__ = capturable_class(type(transformer))
        transformer.register_forward_pre_hook(_GraphFriendlyCalls(), with_kwargs=True)

    def spatial_divisor(self, cfg: ModelConfig) -> int:
        vae, tr = self.component_config(cfg, "vae"), self.component_config(cfg, "transformer")
        vae_scale = 2 ** (len(vae["block_out_channels"]) - 1)
        return max(AR_GRID, vae_scale * int(tr.get("patch_size", 2)) * 2)  # check_inputs: vae x patch x 2

    # -- text ------------------------------------------------------------------------------
    def text_lengths(self, tokenizer, prompts: Sequence[str], cfg: ModelConfig, instruction: bool) -> List[TextLength]:
        limit = cfg.max_sequence_length
        out = []
        for p in prompts:
            n, cut = glyph_length(tokenizer, p, limit)
            out.append(TextLength(used=n, raw=n + 1 if cut else n, limit=n if cut else max(n, limit)))
        return out

    def encode(self, pipe, prompts: Sequence[str], cfg: ModelConfig, device, instruction: bool) -> TextEmbeds:
        import torch

        embeds, _ = pipe.encode_prompt(list(prompts), do_classifier_free_guidance=False, device=device,
                                       max_sequence_length=cfg.max_sequence_length)
        # Each prompt's real rows sit at the right end (the pipeline left-pads a batch with zero rows).
        lengths = [glyph_length(pipe.tokenizer, p, cfg.max_sequence_length)[0] for p in prompts]
        width = embeds.shape[1]
        mask = torch.tensor([[0] * (width - n) + [1] * n for n in lengths], dtype=torch.long)
        return TextEmbeds(embeds=embeds, mask=mask.to(embeds.device))

    # -- the prior, then the DiT -----------------------------------------------------------
    def prior(self, pipe, prompt: str, seed: int, height: int, width: int) -> Tuple[torch.Tensor, dict]:
        """The AR's tokens for one prompt, as `generate_prior_tokens` makes them (upsampled 2x for
        the DiT), and the json fields that record them."""
        import torch

        ids, _, _ = pipe.generate_prior_tokens(prompt=prompt, height=height, width=width,
                                               device=pipe._execution_device,
                                               generator=torch.Generator().manual_seed(int(seed)))
        h, w = height // AR_GRID, width // AR_GRID
        grid = ids.view(2 * h, 2 * w)[::2, ::2]  # the AR's own 1/32 grid (the upsampling is nearest 2x)
        digest = hashlib.sha256(grid.to("cpu", torch.int64).contiguous().numpy().astype("<i8").tobytes()).hexdigest()
        return ids, {"prior_tokens_sha256": digest, "prior_grid": [h, w]}

    def row_inputs(self, pipe, prompts: Sequence[str], seeds: Sequence[int], height: int, width: int,
                   device) -> RowInputs:
        """The encode stage's part: every row's prior tokens (and their json fields). The prior runs
        once per distinct (prompt, seed): a batch's dummy rows repeat its last row, and the prior,
        seeded by the row, would only make the same tokens again (an autoregressive pass each)."""
        import torch

        made: dict = {}
        for key in zip(prompts, seeds):
            if key not in made:
                made[key] = self.prior(pipe, key[0], key[1], height, width)
        rows = [made[key] for key in zip(prompts, seeds)]
        return RowInputs(tensors={"prior_token_ids": torch.cat([ids for ids, _ in rows])},
                         meta=[dict(meta) for _, meta in rows])

    def _prior_ids(self, pipe, request: DenoiseRequest) -> torch.Tensor:
        """The request's prior tokens: the encode stage's, or made here for a request built by hand."""
        extra = request.row_inputs
        if extra is None:
            extra = self.row_inputs(pipe, request.prompts, request.seeds, request.height, request.width,
                                    pipe._execution_device)
            request.meta = list(extra.meta)
        return extra.tensors["prior_token_ids"]

    def pipeline_kwargs(self, request: DenoiseRequest) -> dict:
        """Everything but `prior_token_ids` (`_prior_ids`)."""
        cfg_on = request.negative is not None
        return dict(
            prompt_embeds=request.positive.embeds,
            negative_prompt_embeds=None,  # the pipeline's own: empty glyph text (module docstring)
            guidance_scale=request.guidance_scale if cfg_on else 1.0,  # the pipeline runs CFG for > 1
            num_inference_steps=request.steps,
            height=request.height,
            width=request.width,
            generator=cpu_generators(request.seeds),
        )

    def denoise(self, pipe, request: DenoiseRequest):
        return pipe(**self.pipeline_kwargs(request), prior_token_ids=self._prior_ids(pipe, request),
                    output_type=self.denoise_output, return_dict=False)[0]

    def denoise_decode(self, pipe, request: DenoiseRequest):
        import numpy as np

        images = pipe(**self.pipeline_kwargs(request), prior_token_ids=self._prior_ids(pipe, request),
                      output_type="np", return_dict=False)[0]
        return np.asarray(images, dtype=np.float32)

    # -- decode ----------------------------------------------------------------------------
    denoise_output = "latent"

    def decode(self, pipe, latents: torch.Tensor, request: DenoiseRequest) -> torch.Tensor:
        """GlmImagePipeline.__call__'s own decode + postprocess("pt"), op for op, with the VAE's
        statistics made on the device once (a host list -> device copy would make the host wait)."""
        latents = latents.to(pipe.vae.dtype)
        mean, std = _vae_stats(pipe.vae, latents.device, latents.dtype)
        image = pipe.vae.decode(latents * std + mean, return_dict=False, generator=cpu_generators(request.seeds))[0]
        return pipe.image_processor.postprocess(image, output_type="pt")


_STATS: "weakref.WeakKeyDictionary[torch.nn.Module, Dict[tuple, Tuple[torch.Tensor, torch.Tensor]]]" = (
    weakref.WeakKeyDictionary())


def _vae_stats(vae, device, dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """(mean, std) [1, C, 1, 1] by the pipeline's ops, once per (VAE, device, dtype)."""
    import torch

    per_vae = _STATS.setdefault(vae, {})
    key = (torch.device(device), dtype)
    if key not in per_vae:
        c = vae.config.latent_channels
        per_vae[key] = (torch.tensor(vae.config.latents_mean).view(1, c, 1, 1).to(device, dtype),
                        torch.tensor(vae.config.latents_std).view(1, c, 1, 1).to(device, dtype))
    return per_vae[key]


register_family(GlmImageFamily())
