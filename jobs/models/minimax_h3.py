"""MiniMax-H3 text-to-video with sound (`t2va`): diffusers 0.42.1 ships it as a modular pipeline only
(`MiniMaxH3ModularPipeline`, blocks in modular_pipelines/minimax_h3/), over the real classes
`MiniMaxH3Transformer3DModel`, `AutoencoderKLMiniMaxH3`, `AutoencoderKLMiniMaxH3Audio`,
`MiniMaxH3Scheduler` (video and audio) and a Qwen3-VL conditioner.

Why the family runs its own stages instead of calling the modular pipeline: that pipeline packs one
request into one sequence and is batch 1 by construction (`MiniMaxH3TextEncoderStep` takes a single
string; `MiniMaxH3PrepareLatentsStep` draws `(1, C, F, h, w)` and flattens rows; the loop denoiser
calls the transformer on `latents[None]`; `MiniMaxH3AfterDenoiseStep` reshapes rows with `-1` as the
batch). The transformer itself takes a batch: rows of equal text length share one layout
(`position_ids`, tags, indices are per row of the packed sequence, not per item). So the job keeps
the modular pipeline as the container of the components (and of the model facts it exposes:
`text_encoder_layer`, `fps`, `patch_size`, ...), and runs the blocks' own functions, batched:

    encode   the prompt verbatim, no special tokens, Qwen3-VL `hidden_states[50]`, one prompt a call
             (as `get_qwen3vl_prompt_embeds`; text only, so every `mm_token_type_ids` is 0)
    denoise  `build_packed_sequence` (one layout per batch), each row's noise from its own CPU
             generator (video first, then audio: `MiniMaxH3PrepareLatentsStep`'s order),
             `build_row_timesteps` per step, then the loop: one transformer call a step over the
             batch, both schedulers stepped as `MiniMaxH3LoopSchedulerStep` steps them
    decode   `MiniMaxH3AfterDenoiseStep`'s unpatchify, the video VAE and the audio VAE as the decode
             steps run them: KEY.mp4 at 24 fps and KEY.wav (stereo, 32 kHz in the release)

tests/test_family_minimax_h3.py checks that this gives the modular pipeline's own video and sound,
bit for bit, for the same text embeddings and seed.

Per-row timesteps: one forward serves rows at two noise levels (video, audio); the pipeline reduces
them to `(distinct timesteps, index per row)` on the host, once per step. Here the whole plan is
built on the host from the schedules' host grids and moved to the device once per signature (with
the layout), so each step hands the transformer device tensors the graph runner copies into its
static buffers: nothing is built on the host or read back from the device inside a step, and the
forward captures as one segment (the alternative, an eager break around the timestep embedding, would
split every call for no gain). The number of distinct timesteps is part of the shape: at the first
step both schedules are at t=0 (one value), then they differ (two), so a run has two graph keys.

Model facts enforced: a clip is `17n + 5` frames (the VAE's chunking) of 5 to 15 s at the fixed
24 fps (the pipeline's `min_duration`/`max_duration`): 124 frames at least. Sizes are multiples of
32 (VAE 16x times patch 2). The checkpoint is guidance-distilled: no negative prompt, no CFG
(presets set guidance_scale 1.0; the job refuses more). Text is never padded (padding/minimax_h3.py).
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

from jobs.config import ModelConfig
from jobs.errors import UserError
from jobs.models.base import Decoded, DenoiseRequest, ModelFamily, TextLength
from jobs.models.registry import register_family
from jobs.models.tiny import tiny_text_encoder, tiny_tokenizer
from padding import TextEmbeds

if TYPE_CHECKING:
    import torch

FPS = 24  # MINIMAX_H3_FPS: the model generates and conditions at this rate only
MIN_SECONDS, MAX_SECONDS = 5.0, 15.0  # MiniMaxH3ModularPipeline.min_duration / max_duration
COMPONENTS = ("transformer", "vae", "audio_vae", "text_encoder", "tokenizer", "scheduler", "audio_scheduler")


def frames_rule(n: int, per_chunk: int, kept: int) -> Optional[str]:
    """None where `n` frames is a clip MiniMax-H3 makes: per_chunk*k + kept frames, 5 to 15 s at 24 fps."""
    lo, hi = math.ceil(MIN_SECONDS * FPS), math.floor(MAX_SECONDS * FPS)
    ok = [f for f in range(lo, hi + 1) if f % per_chunk == kept]
    if n in ok:
        return None
    near = min(ok, key=lambda f: (abs(f - n), f))
    return (f"num_frames={n}, but MiniMax-H3 makes {per_chunk}k+{kept} frames (its VAE's chunks) of "
            f"{MIN_SECONDS:g} to {MAX_SECONDS:g} s at {FPS} fps ({ok[0]} to {ok[-1]}); use {near}")


def cast_keeping_fp32(module: torch.nn.Module, dtype: torch.dtype) -> None:
    """Cast `module` to `dtype` as `from_pretrained(torch_dtype=dtype)` loads a float32 save of it: what
    its class keeps in float32 (`_keep_in_fp32_modules`: the transformer's patch projections, timestep
    MLP and heads; most of the audio VAE; the video VAE's norms and residual scales) stays float32,
    untouched, and so do the non-persistent buffers (they are not in the checkpoint).

    The rule is `from_pretrained`'s own: a state-dict tensor stays float32 when one of the
    dot-separated parts of its name is a kept name. Matching tensor names, not module names,
    matters: the video VAE keeps bare parameters (`scale1`, `scale2`) that make its residual stream
    float32, so its float32 `norm_out` gets float32 input (a module-only match left them bf16, which
    CUDA's LayerNorm refuses)."""
    keep = getattr(module, "_keep_in_fp32_modules", None) or []
    for name, tensor in module.state_dict(keep_vars=True).items():
        if tensor.is_floating_point() and not any(k in name.split(".") for k in keep):
            tensor.data = tensor.data.to(dtype)


class MiniMaxH3Family(ModelFamily):
    name = "minimax_h3"
    pipeline_class = "MiniMaxH3ModularPipeline"
    components = COMPONENTS
    video = True
    fps_conditions = True  # fixed 24 fps: the audio length follows the clip's duration at that rate
    fixed_fps = float(FPS)

    def __init__(self) -> None:
        self._prepared: dict = {}
    guidance = False  # guidance-distilled: one transformer call a step, no negative prompt
    min_steps = 2  # MiniMaxH3Scheduler.set_timesteps refuses fewer than 2 inference steps

    # -- loading ---------------------------------------------------------------------------
    def _assemble(self, **parts):
        """The modular pipeline as the components' container (see the module docstring)."""
        from diffusers.modular_pipelines import MiniMaxH3Blocks

        pipe = MiniMaxH3Blocks().get_workflow("t2va").init_pipeline()
        pipe.update_components(**parts)
        return pipe

    def build_tiny(self, cfg: ModelConfig, dtype: torch.dtype):
        import torch
        from diffusers import (
            AutoencoderKLMiniMaxH3,
            AutoencoderKLMiniMaxH3Audio,
            MiniMaxH3Scheduler,
            MiniMaxH3Transformer3DModel,
        )

        tiny = cfg.tiny
        assert tiny is not None  # preflight refuses model.path=None without a tiny section
        assert tiny.audio_vae is not None and tiny.audio_scheduler is not None, \
            "a MiniMax-H3 tiny preset has model.tiny.audio_vae and .audio_scheduler"
        torch.manual_seed(int(tiny.seed))
        spec = dict(tiny.text_encoder)
        tokenizer = tiny_tokenizer(spec)
        spec["config"] = dict(spec["config"], image_token_id=tokenizer.convert_tokens_to_ids("<|image_pad|>"),
                              video_token_id=tokenizer.convert_tokens_to_ids("<|video_pad|>"))
        # Built in the order the seeded weights were always drawn in. The ignores: mypy types
        # diffusers' top-level exports as their dummy placeholder classes (a stub gap).
        text_encoder = tiny_text_encoder(spec)
        transformer = MiniMaxH3Transformer3DModel(**tiny.transformer).eval()  # type: ignore[attr-defined]  # stub gap
        vae = AutoencoderKLMiniMaxH3(**tiny.vae).eval()  # type: ignore[attr-defined]  # stub gap
        audio_vae = AutoencoderKLMiniMaxH3Audio(**tiny.audio_vae).eval()  # type: ignore[attr-defined]  # stub gap
        pipe = self._assemble(
            text_encoder=text_encoder,
            tokenizer=tokenizer,
            transformer=transformer,
            vae=vae,
            audio_vae=audio_vae,
            scheduler=MiniMaxH3Scheduler(**tiny.scheduler),
            audio_scheduler=MiniMaxH3Scheduler(**tiny.audio_scheduler),
        )
        if dtype != torch.float32:
            for name in ("transformer", "vae", "audio_vae", "text_encoder"):
                cast_keeping_fp32(getattr(pipe, name), dtype)
        return self.prepare(pipe, cfg)

    def check_path(self, cfg: ModelConfig) -> None:
        """A local folder with the t2va components' subfolders (the release's layout; `save` writes it)."""
        assert cfg.path is not None  # preflight checks a path only where model.path is set
        if not os.path.isdir(cfg.path):
            raise UserError(f"model.path={cfg.path!r} is not a folder: pass a local MiniMax-H3 folder (with "
                            f"{', '.join(COMPONENTS)} subfolders)")
        missing = [c for c in COMPONENTS if not os.path.isdir(os.path.join(cfg.path, c))]
        if missing:
            raise UserError(f"model.path={cfg.path!r} lacks the subfolder(s) {', '.join(missing)} of MiniMax-H3's t2va "
                            f"components; download MiniMaxAI/MiniMax-H3 (its transformer/ partition, not "
                            f"transformer_ref/) to a local folder and pass that")

    def from_pretrained(self, cfg: ModelConfig, dtype: torch.dtype, **components):
        import diffusers
        import transformers
        from transformers import AutoTokenizer

        def sub(name):
            return os.path.join(cfg.path, name)

        opts: Dict[str, Any] = dict(local_files_only=True, use_safetensors=True)
        return self._assemble(
            transformer=diffusers.MiniMaxH3Transformer3DModel.from_pretrained(sub("transformer"), dtype=dtype,
                                                                              **opts),
            vae=diffusers.AutoencoderKLMiniMaxH3.from_pretrained(sub("vae"), dtype=dtype, **opts),
            audio_vae=diffusers.AutoencoderKLMiniMaxH3Audio.from_pretrained(sub("audio_vae"), dtype=dtype, **opts),
            text_encoder=transformers.Qwen3VLForConditionalGeneration.from_pretrained(sub("text_encoder"), dtype=dtype,
                                                                                      **opts).eval(),
            tokenizer=AutoTokenizer.from_pretrained(sub("tokenizer"), local_files_only=True),
            scheduler=diffusers.MiniMaxH3Scheduler.from_pretrained(sub("scheduler"), local_files_only=True),
            audio_scheduler=diffusers.MiniMaxH3Scheduler.from_pretrained(sub("audio_scheduler"), local_files_only=True),
        )

    def save(self, pipe, path) -> None:
        """Each component into its subfolder, the layout `from_pretrained` reads."""
        for name in COMPONENTS:
            getattr(pipe, name).save_pretrained(os.path.join(path, name))

    def load_tokenizer(self, cfg: ModelConfig):
        if cfg.path is None:
            assert cfg.tiny is not None  # preflight refuses model.path=None without a tiny section
            return tiny_tokenizer(cfg.tiny.text_encoder)
        return super().load_tokenizer(cfg)

    # -- geometry --------------------------------------------------------------------------
    def spatial_divisor(self, cfg: ModelConfig) -> int:
        vae, tr = self.component_config(cfg, "vae"), self.component_config(cfg, "transformer")
        spatial = math.prod(vae.get("spatial_downsample_factors", (2, 2, 2, 2, 1, 1)))
        return spatial * int(tuple(tr.get("patch_size", (1, 2, 2)))[2])  # MiniMaxH3ModularPipeline.canvas_multiple

    def frames_error(self, cfg: ModelConfig, n: int) -> Optional[str]:
        vae = self.component_config(cfg, "vae")
        per_chunk = int(vae.get("clip_length", 17))
        kept = math.ceil(per_chunk / math.prod(vae.get("temporal_downsample_factors", (1, 2, 2, 1, 1, 1))))
        return frames_rule(n, per_chunk, kept)

    # -- text ------------------------------------------------------------------------------
    def text_lengths(self, tokenizer, prompts: Sequence[str], cfg: ModelConfig, instruction: bool) -> List[TextLength]:
        # The prompt verbatim, no special tokens, never cut (MiniMaxH3TextEncoderStep).
        raw = [len(ids) for ids in tokenizer(list(prompts), add_special_tokens=False)["input_ids"]]
        return [TextLength(used=n, raw=n, limit=max(n, cfg.max_sequence_length)) for n in raw]

    def encode(self, pipe, prompts: Sequence[str], cfg: ModelConfig, device, instruction: bool) -> TextEmbeds:
        """`get_qwen3vl_prompt_embeds` for a text-only presentation, one prompt a call (a prompt's embedding
        does not depend on its batch); the rows of a batch have one length (the padder's bucket)."""
        import torch

        encoder = pipe.text_encoder
        layer = pipe.text_encoder_layer  # 50: after the 50th decoder layer, not the post-norm last one
        rows = []
        for prompt in prompts:
            ids = pipe.tokenizer(prompt, add_special_tokens=False)["input_ids"]
            input_ids = torch.tensor([ids], dtype=torch.long, device=device)
            out = encoder.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                mm_token_type_ids=torch.zeros_like(input_ids), use_cache=False,
                                output_hidden_states=True)
            rows.append(out.hidden_states[layer].to(device=device, dtype=encoder.dtype))
        lengths = {r.shape[1] for r in rows}
        assert len(lengths) == 1, f"one batch, several text lengths {sorted(lengths)}: the plan must bucket them apart"
        embeds = torch.cat(rows)
        return TextEmbeds(embeds=embeds, mask=torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device))

    # -- denoise ---------------------------------------------------------------------------
    denoise_output = "latent"

    def geometry(self, pipe, request: DenoiseRequest) -> dict:
        from diffusers.modular_pipelines.minimax_h3.modular_pipeline import (
            audio_latent_num_frames,
            video_latent_num_frames,
        )

        ratio = pipe.vae_spatial_compression_ratio
        return dict(num_latent_frames=video_latent_num_frames(request.num_frames, pipe.vae_frames_per_chunk,
                                                              pipe.vae_latents_per_chunk),
                    latent_height=request.height // ratio, latent_width=request.width // ratio,
                    num_audio_latents=audio_latent_num_frames(request.num_frames))

    def layout(self, pipe, text_rows: int, geo: dict) -> dict:
        """MiniMaxH3PrepareLayoutStep's t2va layout, on the host (one for the whole batch)."""
        import torch
        from diffusers.modular_pipelines.minimax_h3.before_denoise import MiniMaxH3PrepareLayoutStep

        pos, tags, video, audio, text, _, _ = MiniMaxH3PrepareLayoutStep.build_packed_sequence(
            torch.full((text_rows,), pipe.text_tag, dtype=torch.long), geo["num_latent_frames"],
            geo["latent_height"], geo["latent_width"], geo["num_audio_latents"], pipe.patch_size,
            pipe.audio_channels, pipe.audio_tag, pipe.video_tag)
        return dict(position_ids=pos, token_tags=tags, video_indices=video, audio_indices=audio, text_indices=text)

    def noise(self, pipe, seeds: Sequence[int], geo: dict, device):
        """Each row's video then audio noise from its own generator, as MiniMaxH3PrepareLatentsStep draws them."""
        import torch
        from diffusers.modular_pipelines.minimax_h3.before_denoise import patchify_video_latents
        from diffusers.utils.torch_utils import randn_tensor

        video, audio = [], []
        for seed in seeds:
            g = torch.Generator("cpu").manual_seed(int(seed))
            v = randn_tensor((1, pipe.vae_latent_channels, geo["num_latent_frames"], geo["latent_height"],
                              geo["latent_width"]), generator=g, device=device, dtype=torch.float32)
            video.append(patchify_video_latents(v, pipe.patch_size))
            audio.append(randn_tensor((geo["num_audio_latents"] * pipe.audio_channels, pipe.audio_latent_channels),
                                      generator=g, device=device, dtype=torch.float32))
        return torch.stack(video), torch.stack(audio)  # [B, Nv, C*patch], [B, Na*channels, Ca]

    def timestep_plan(self, pipe, steps: int, layout: dict) -> list:
        """MiniMaxH3SetTimestepsStep's plan: every step's (distinct timesteps, index per row), built on the
        host from the schedules' host grids (no read back from the device)."""
        from diffusers.modular_pipelines.minimax_h3.before_denoise import MiniMaxH3SetTimestepsStep

        video, audio = (type(s)(shift=s.shift) for s in (pipe.scheduler, pipe.audio_scheduler))
        video.set_timesteps(steps)
        audio.set_timesteps(steps)
        return [MiniMaxH3SetTimestepsStep.build_row_timesteps(
                    layout["video_indices"], layout["audio_indices"], 0, 0, layout["text_indices"].numel(),
                    float(t), float(ta), max(float(t), pipe.keyframe_noise_aug), 1.0)
                for t, ta in zip(video.timesteps, audio.timesteps)]

    def prepared(self, pipe, text_rows: int, geo: dict, steps: int, device):
        """(layout, timestep plan) on the device, made once per (text length, geometry, steps): every batch
        of a signature reuses them, so a batch copies nothing small to the device before its loop."""
        key = (tuple(pipe.patch_size), pipe.audio_channels, pipe.scheduler.shift, pipe.audio_scheduler.shift,
               text_rows, tuple(sorted(geo.items())), steps, str(device))  # what they are made from
        if key not in self._prepared:
            if len(self._prepared) >= 64:
                self._prepared.clear()
            layout = self.layout(pipe, text_rows, geo)
            plan = [(u.to(device), i.to(device)) for u, i in self.timestep_plan(pipe, steps, layout)]
            self._prepared[key] = ({k: v.to(device) for k, v in layout.items()}, plan)
        return self._prepared[key]

    def denoise(self, pipe, request: DenoiseRequest):
        """-> (video rows [B, Nv, C'], audio rows [B, Na, Ca], geometry), denoised."""
        text = request.positive.embeds
        device = text.device
        geo = self.geometry(pipe, request)
        layout, plan = self.prepared(pipe, text.shape[1], geo, request.steps, device)
        video, audio = self.noise(pipe, request.seeds, geo, device)
        for scheduler in (pipe.scheduler, pipe.audio_scheduler):
            scheduler.set_timesteps(request.steps, device=device)
            scheduler.set_begin_index(0)  # the index the first step would look up (a host read of the device)
        transformer = self.transformer(pipe)
        for i, (t, ta) in enumerate(zip(pipe.scheduler.timesteps, pipe.audio_scheduler.timesteps)):
            timestep, indices = plan[i]
            v_pred, a_pred = transformer(hidden_states=video, audio_hidden_states=audio, encoder_hidden_states=text,
                                         timestep=timestep, timestep_indices=indices, return_dict=False, **layout)
            # MiniMaxH3LoopSchedulerStep, on the batch (each op is per element: the rows' bits are their own)
            video = pipe.scheduler.step(v_pred.float(), t, video, return_dict=False)[0]
            audio = pipe.audio_scheduler.step(a_pred.float(), ta, audio, return_dict=False)[0]
        return video, audio, geo

    # -- decode ----------------------------------------------------------------------------
    def decode(self, pipe, latents, request: DenoiseRequest) -> Decoded:
        """MiniMaxH3AfterDenoiseStep + the video and audio decode steps, op for op, for a batch."""
        import torch

        video, audio, geo = latents
        n = video.shape[0]
        pt, ph, pw = pipe.patch_size
        c = pipe.vae_latent_channels
        rows = video.reshape(n, geo["num_latent_frames"] // pt, geo["latent_height"] // ph, geo["latent_width"] // pw,
                             c, pt, ph, pw).permute(0, 4, 1, 5, 2, 6, 3, 7)
        video = rows.reshape(n, c, geo["num_latent_frames"], geo["latent_height"], geo["latent_width"]).contiguous()
        device = video.device
        mean = torch.tensor(pipe.vae.config.latents_mean, device=device).view(1, -1, 1, 1, 1)
        std = torch.tensor(pipe.vae.config.latents_std, device=device).view(1, -1, 1, 1, 1)
        frames = pipe.vae.decode(video * std + mean, return_dict=False)[0]
        pmean = torch.tensor(pipe.pixel_mean, device=device).view(1, -1, 1, 1, 1)
        pstd = torch.tensor(pipe.pixel_std, device=device).view(1, -1, 1, 1, 1)
        frames = (frames.float() * pstd + pmean).clamp(0, 1)
        frames = pipe.video_processor.postprocess_video(frames, output_type="pt")  # [B, F, 3, H, W]

        ch = pipe.audio_channels
        audio = audio.reshape(n * ch, geo["num_audio_latents"], audio.shape[-1]).permute(0, 2, 1).contiguous()
        amean = torch.tensor(pipe.audio_vae.config.latents_mean, device=device).view(1, -1, 1)
        astd = torch.tensor(pipe.audio_vae.config.latents_std, device=device).view(1, -1, 1)
        wave = pipe.audio_vae.decode(audio * astd + amean, return_dict=False)[0]  # [B*ch, 1, N], mono per channel
        wave = wave.float().reshape(n, ch, -1)
        return Decoded(images=frames, audio=wave, sample_rate=int(pipe.audio_sampling_rate))

    def denoise_decode(self, pipe, request: DenoiseRequest):
        import numpy as np

        out = self.decode(pipe, self.denoise(pipe, request), request)
        return np.asarray(out.images.permute(0, 1, 3, 4, 2).float().cpu().numpy(), dtype=np.float32)


register_family(MiniMaxH3Family())
