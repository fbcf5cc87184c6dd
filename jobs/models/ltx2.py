"""LTX-2 text-to-video with sound (diffusers `LTX2Pipeline`, `LTX2VideoTransformer3DModel`,
`AutoencoderKLLTX2Video`, `AutoencoderKLLTX2Audio`, `LTX2Vocoder`, `LTX2TextConnectors`).

One transformer denoises video and audio latents together; the job graphs it as any other.

Text: every prompt is encoded at max_sequence_length (1024), left-padded, and the pipeline's text
connectors turn the padding into attended registers: the padder passes 1024 through and refuses
other lengths (padding/ltx2.py says why). The embeddings handed to the pipeline are Gemma 3's
stacked hidden states, [B, 1024, hidden x (layers + 1)]: for the released 12B encoder ~385 MB a
prompt in bf16, which the job holds for a batch and the one in flight ahead of it.

Guidance: with `guidance_scale` > 1 the pipeline runs its own recipe: CFG at that scale for the
video and its default for the audio (7), spatio-temporal guidance and modality-isolation guidance
at its defaults; each is one more transformer call a step, with its own graph. `guidance_scale` <= 1
turns every term off (one transformer call a step, as the distilled checkpoints run).

Frames and rate: the VAE compresses time 8x (8k+1 frames, 121 by default) and space 32x; sizes are
multiples of 32 (`LTX2Pipeline.check_inputs`). The model conditions on the frame rate (its rotary
time coordinates, and the audio length follows the clip's duration), so `fps_conditions` is set:
every item of a job runs at `sampling.fps` (24 by default).

Sound: the pipeline decodes the audio latents to a mel spectrogram (audio VAE) and a waveform
(vocoder, 24 kHz stereo in the released checkpoints). The job writes it as `KEY.wav` beside
`KEY.mp4` (16-bit PCM, lossless at that depth, bytes reproducible, readable with the standard
library), not muxed into the mp4: muxing would need a lossy audio codec (AAC) inside the video
member, and the two stay easy to mux later (`ffmpeg -i KEY.mp4 -i KEY.wav -c:v copy out.mp4`).

Decode: `denoise` keeps the loop's last latents (packed, still normalized, through the pipeline's
step callback) and `decode` replays the pipeline's own decode on them op for op (the `latent`
output of the pipeline de-normalizes in float32 where its own decode does it in the model dtype),
so the staged path gives the pipeline's bytes (tests/test_family_ltx2.py).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

from jobs.config import ModelConfig
from jobs.models.base import Decoded, DenoiseRequest, ModelFamily, TextLength, cpu_generators
from jobs.models.registry import register_family
from jobs.models.tiny import build_scheduler, tiny_text_encoder, tiny_tokenizer
from jobs.models.wan import frames_rule_error
from padding import TextEmbeds

if TYPE_CHECKING:
    import torch

PIPELINE_MULTIPLE = 32  # LTX2Pipeline.check_inputs: height and width divisible by 32
CONNECTOR_REGISTERS = 128  # LTX2TextConnectors' default video and audio register counts


def vae_ratios(vae: dict) -> Tuple[int, int]:
    """(spatial, temporal) compression of an AutoencoderKLLTX2Video config, by the rule its __init__
    applies (explicit ratios win; else patch size x 2 per scaling block). tests pin it to the class."""
    blocks = len(vae.get("layers_per_block", (4, 6, 6, 2, 2)))
    scaling = vae.get("spatio_temporal_scaling", (True, True, True, True))
    if isinstance(scaling, bool):
        scaling = (scaling,) * (blocks - 1)
    spatial = vae.get("spatial_compression_ratio") or int(vae.get("patch_size", 4)) * 2 ** sum(map(bool, scaling))
    temporal = vae.get("temporal_compression_ratio") or int(vae.get("patch_size_t", 1)) * 2 ** sum(map(bool, scaling))
    return int(spatial), int(temporal)


class LTX2Family(ModelFamily):
    name = "ltx2"
    pipeline_class = "LTX2Pipeline"
    components = ("transformer", "vae", "audio_vae", "text_encoder", "tokenizer", "connectors", "vocoder",
                  "scheduler")
    video = True
    fps_conditions = True

    # -- loading ---------------------------------------------------------------------------
    def build_tiny(self, cfg: ModelConfig, dtype: torch.dtype):
        import torch
        from diffusers import AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video, LTX2Pipeline, LTX2VideoTransformer3DModel
        from diffusers.pipelines.ltx2 import LTX2TextConnectors, LTX2Vocoder

        tiny = cfg.tiny
        assert tiny is not None  # preflight refuses model.path=None without a tiny section
        assert tiny.audio_vae is not None and tiny.connectors is not None and tiny.vocoder is not None, \
            "an LTX-2 tiny preset has model.tiny.audio_vae, .connectors and .vocoder"
        torch.manual_seed(int(tiny.seed))
        pipe = LTX2Pipeline(
            scheduler=build_scheduler(tiny.scheduler),
            vae=AutoencoderKLLTX2Video(**tiny.vae),
            audio_vae=AutoencoderKLLTX2Audio(**tiny.audio_vae),
            text_encoder=tiny_text_encoder(tiny.text_encoder),
            # a fresh tokenizer: the pipeline sets padding_side="left" on the one it holds
            tokenizer=tiny_tokenizer(tiny.text_encoder),
            connectors=LTX2TextConnectors(**tiny.connectors),
            transformer=LTX2VideoTransformer3DModel(**tiny.transformer),
            vocoder=LTX2Vocoder(**tiny.vocoder),
        )
        return self.prepare_tiny(pipe, cfg, dtype)

    def from_pretrained(self, cfg: ModelConfig, dtype: torch.dtype, **components):
        # The prompt enhancer (and its processor) only rewrite prompts by generating text: a batch
        # job encodes exactly the prompts it was given. The duration head only runs without num_frames.
        return super().from_pretrained(cfg, dtype, processor=None, prompt_enhancer=None, duration_head=None,
                                       **components)

    def spatial_divisor(self, cfg: ModelConfig) -> int:
        spatial, _ = vae_ratios(self.component_config(cfg, "vae"))
        patch = int(self.component_config(cfg, "transformer").get("patch_size", 1))
        return math.lcm(PIPELINE_MULTIPLE, spatial * patch)

    def frames_error(self, cfg: ModelConfig, n: int) -> Optional[str]:
        _, temporal = vae_ratios(self.component_config(cfg, "vae"))
        return frames_rule_error(n, temporal, self.pipeline_class)

    # -- text ------------------------------------------------------------------------------
    def text_length_multiple(self, cfg: ModelConfig) -> Optional[Tuple[int, str]]:
        # LTX2TextConnectors tiles its learned registers over the padded sequence: a length that is not a
        # multiple of their count is refused inside the first encode (ValueError), after the whole load.
        conn = self.component_config(cfg, "connectors")
        counts = {conn.get(f"{part}_connector_num_learnable_registers", CONNECTOR_REGISTERS)
                  for part in ("video", "audio")} - {None}
        if not counts:
            return None
        n = math.lcm(*map(int, counts))
        return n, (f"LTX-2's text connectors tile {n} learned registers over the padded prompt "
                   f"(connectors' *_num_learnable_registers), so it must be a multiple of {n}")

    def text_lengths(self, tokenizer, prompts: Sequence[str], cfg: ModelConfig, instruction: bool) -> List[TextLength]:
        limit = cfg.max_sequence_length
        texts = [p.strip() for p in prompts]  # as _get_gemma_prompt_embeds strips them
        raw = [len(ids) for ids in tokenizer(texts, add_special_tokens=True)["input_ids"]]
        return [TextLength(used=max(1, min(n, limit)), raw=n, limit=limit) for n in raw]

    def encode(self, pipe, prompts: Sequence[str], cfg: ModelConfig, device, instruction: bool) -> TextEmbeds:
        embeds, mask, _, _ = pipe.encode_prompt(list(prompts), do_classifier_free_guidance=False,
                                                max_sequence_length=cfg.max_sequence_length, device=device)
        return TextEmbeds(embeds=embeds, mask=mask)

    # -- denoise + decode ------------------------------------------------------------------
    denoise_output = "latent"

    def pipeline_kwargs(self, request: DenoiseRequest) -> dict:
        pos, neg = request.positive, request.negative
        kwargs = dict(
            prompt_embeds=pos.embeds,
            prompt_attention_mask=pos.mask,
            height=request.height,
            width=request.width,
            num_frames=request.num_frames,
            frame_rate=request.fps,
            num_inference_steps=request.steps,
            generator=cpu_generators(request.seeds),
            max_sequence_length=pos.length,
        )
        if neg is not None:
            kwargs.update(negative_prompt_embeds=neg.embeds, negative_prompt_attention_mask=neg.mask,
                          guidance_scale=request.guidance_scale)
        else:  # no negative branch, and no other guidance term (see the module docstring)
            kwargs.update(guidance_scale=1.0, audio_guidance_scale=1.0, stg_scale=0.0, audio_stg_scale=0.0,
                          modality_scale=1.0, audio_modality_scale=1.0)
        return kwargs

    def denoise(self, pipe, request: DenoiseRequest):
        """-> (video latents packed [B, S, C] as the loop left them, audio latents [B, C, L, M] as the
        pipeline hands them to its audio VAE, the generators the loop drew from)."""
        kwargs = self.pipeline_kwargs(request)
        final = {}

        def keep_last(_pipe, _step, _t, tensors):
            final["latents"] = tensors["latents"]
            return {}

        _, audio = pipe(**kwargs, callback_on_step_end=keep_last, callback_on_step_end_tensor_inputs=["latents"],
                        output_type="latent", return_dict=False)
        return final["latents"], audio, kwargs["generator"]

    def decode(self, pipe, latents, request: DenoiseRequest) -> Decoded:
        """LTX2Pipeline.__call__'s own decode, op for op, of video and sound."""
        import torch
        from diffusers.utils.torch_utils import randn_tensor

        packed, audio_latents, generators = latents
        temporal, spatial = pipe.vae_temporal_compression_ratio, pipe.vae_spatial_compression_ratio
        video = pipe._unpack_latents(packed, (request.num_frames - 1) // temporal + 1, request.height // spatial,
                                     request.width // spatial, pipe.transformer_spatial_patch_size,
                                     pipe.transformer_temporal_patch_size)
        video = video.to(request.positive.embeds.dtype)  # the pipeline's prompt_embeds dtype
        timestep = None
        if pipe.vae.config.timestep_conditioning:  # decode_timestep 0.0 and its noise scale, as the pipeline's defaults
            noise = randn_tensor(video.shape, generator=generators, device=video.device, dtype=video.dtype)
            n = video.shape[0]
            timestep = torch.zeros(n, device=video.device, dtype=video.dtype)  # = tensor([0.0] * n), no host copy
            scale = torch.zeros(n, device=video.device, dtype=video.dtype)[:, None, None, None, None]
            video = (1 - scale) * video + scale * noise
        video = pipe._denormalize_latents(video, pipe.vae.latents_mean, pipe.vae.latents_std,
                                          pipe.vae.config.scaling_factor)
        frames = pipe.vae.decode(video.to(pipe.vae.dtype), timestep, return_dict=False)[0]
        frames = pipe.video_processor.postprocess_video(frames, output_type="pt")
        mel = pipe.audio_vae.decode(audio_latents.to(pipe.audio_vae.dtype), return_dict=False)[0]
        return Decoded(images=frames, audio=pipe.vocoder(mel), sample_rate=self.sample_rate(pipe))

    @staticmethod
    def sample_rate(pipe) -> int:
        return int(pipe.vocoder.config.output_sampling_rate)


register_family(LTX2Family())
