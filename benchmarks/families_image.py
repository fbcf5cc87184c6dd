"""The image families for `bench_families.py`: real transformer configs (the released checkpoints'
transformer/config.json) and one denoising step each, called the way its pipeline calls it
(diffusers 0.42.1): Qwen-Image and LongCat-Image two calls a step (CFG), Flux.1-dev one (distilled
guidance), Z-Image one (Turbo, no CFG); random text embeddings of the encoder's width and the
family's text length.
"""

from __future__ import annotations

from pathlib import Path

import torch

import families_video as video

# transformer/config.json of the released checkpoints (diffusers 0.42.1 class defaults where equal)
REAL = {
    "qwen_image": dict(patch_size=2, in_channels=64, out_channels=16, num_layers=60, attention_head_dim=128,
                       num_attention_heads=24, joint_attention_dim=3584, guidance_embeds=False,
                       axes_dims_rope=(16, 56, 56)),  # Qwen/Qwen-Image
    "flux": dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
                 num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
                 axes_dims_rope=(16, 56, 56)),  # black-forest-labs/FLUX.1-dev
    "z_image": dict(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=3840, n_layers=30,
                    n_refiner_layers=2, n_heads=30, n_kv_heads=30, norm_eps=1e-5, qk_norm=True, cap_feat_dim=2560,
                    rope_theta=256.0, t_scale=1000.0, axes_dims=[32, 48, 48], axes_lens=[1024, 512, 512]),
    "longcat_image": dict(patch_size=1, in_channels=64, num_layers=10, num_single_layers=20, attention_head_dim=128,
                          num_attention_heads=24, joint_attention_dim=3584, pooled_projection_dim=3584,
                          axes_dims_rope=[16, 56, 56]),  # meituan-longcat/LongCat-Image
}
CLASSES = {"qwen_image": "QwenImageTransformer2DModel", "flux": "FluxTransformer2DModel",
           "z_image": "ZImageTransformer2DModel", "longcat_image": "LongCatImageTransformer2DModel"}
# text the transformer sees: (positive real tokens, text length); CFG negatives use NEG_REAL tokens
TEXT = {"qwen_image": (77, 128), "flux": (77, 512), "z_image": (77, 77), "longcat_image": (77, 512)}
NEG_REAL = 5
CFG_SCALE = {"qwen_image": 4.0, "longcat_image": 4.5}  # the others run one call per step


def build(family: str, config: dict, device: str, dtype: torch.dtype):
    import diffusers

    torch.manual_seed(0)
    with torch.device(device):
        model = getattr(diffusers, CLASSES[family])(**config)
    if family == "qwen_image":
        from jobs.models.qwen_image import capturable_text_lengths

        capturable_text_lengths()  # what the family installs when it loads a pipeline
    return model.to(dtype).eval().requires_grad_(False)


def make_step(family: str, config: dict, side: int, device: str, dtype: torch.dtype, tiny: bool):
    """(initial latents, step(forward, lat, t) -> velocity). Inputs built as each pipeline builds them."""
    g = torch.Generator(device).manual_seed(0)
    real, length = TEXT[family]
    if tiny:
        real, length = min(real, 16), min(length, 32 if family != "z_image" else 16)
    width = config.get("joint_attention_dim", config.get("cap_feat_dim"))
    pos = torch.randn(1, length, width, generator=g, device=device).to(dtype)
    neg = torch.randn(1, length, width, generator=g, device=device).to(dtype)
    pos_mask = (torch.arange(length, device=device) < real).long()[None]
    neg_mask = (torch.arange(length, device=device) < NEG_REAL).long()[None]
    tokens = (side // 2) ** 2  # latents packed 2x2

    if family == "z_image":
        lat = torch.randn(1, config["in_channels"], 1, side, side, generator=g, device=device)
        caption = pos[0, :real]

        def step(fwd, lat, t):
            out = fwd([lat[0].to(dtype)], ((1000 - t) / 1000).expand(1), [caption], return_dict=False)[0]
            return -torch.stack([o.float() for o in out])
        return lat, step

    lat = torch.randn(1, tokens, config["in_channels"], generator=g, device=device)
    h = w = side // 2
    if family == "qwen_image":
        shapes = [[(1, h, w)]]

        def step(fwd, lat, t):
            kw = dict(hidden_states=lat.to(dtype), timestep=(t / 1000).expand(1).to(dtype), guidance=None,
                      img_shapes=shapes, attention_kwargs={}, return_dict=False)
            cond = fwd(encoder_hidden_states=pos, encoder_hidden_states_mask=pos_mask, **kw)[0].float()
            uncond = fwd(encoder_hidden_states=neg, encoder_hidden_states_mask=neg_mask, **kw)[0].float()
            comb = uncond + CFG_SCALE[family] * (cond - uncond)
            return comb * (cond.norm(dim=-1, keepdim=True) / comb.norm(dim=-1, keepdim=True))
        return lat, step

    img_ids = torch.zeros(h, w, 3, device=device)
    img_ids[..., 1] += torch.arange(h, device=device)[:, None]
    img_ids[..., 2] += torch.arange(w, device=device)[None, :]
    img_ids = img_ids.reshape(-1, 3)
    if family == "flux":
        txt_ids = torch.zeros(length, 3, device=device)
        pooled = torch.randn(1, config["pooled_projection_dim"], generator=g, device=device).to(dtype)
        guidance = torch.full((1,), 3.5, device=device)

        def step(fwd, lat, t):
            return fwd(hidden_states=lat.to(dtype), timestep=(t / 1000).expand(1).to(dtype), guidance=guidance,
                       pooled_projections=pooled, encoder_hidden_states=pos, txt_ids=txt_ids, img_ids=img_ids,
                       joint_attention_kwargs=None, return_dict=False)[0].float()
        return lat, step

    # longcat_image: text positions 0..S-1 on two axes, image positions offset by the text length
    from diffusers.pipelines.longcat_image.pipeline_longcat_image import prepare_pos_ids

    txt_ids = prepare_pos_ids(0, "text", (0, 0), num_token=length).to(device)
    img_ids = prepare_pos_ids(1, "image", (length, length), height=h, width=w).to(device)

    def step(fwd, lat, t):
        ts = (t / 1000).expand(1).to(lat.dtype)
        # as LongCatImagePipeline calls it: guidance=None on the cond call only (two signatures)
        cond = fwd(hidden_states=lat.to(dtype), timestep=ts, guidance=None, encoder_hidden_states=pos,
                   txt_ids=txt_ids, img_ids=img_ids, return_dict=False)[0].float()
        uncond = fwd(hidden_states=lat.to(dtype), timestep=ts, encoder_hidden_states=neg, txt_ids=txt_ids,
                     img_ids=img_ids, return_dict=False)[0].float()
        comb = uncond + CFG_SCALE[family] * (cond - uncond)
        scale = (cond.norm(dim=-1, keepdim=True) / (comb.norm(dim=-1, keepdim=True) + 1e-8)).clamp(0.0, 1.0)
        return comb * scale
    return lat, step


def tiny_configs() -> dict:
    """The tiny presets' transformer configs (conf/model/*_tiny.yaml), for the CPU smoke test."""
    from omegaconf import OmegaConf

    conf = Path(__file__).resolve().parents[1] / "conf" / "model"
    return {f: OmegaConf.to_container(OmegaConf.load(conf / f"{video.TINY.get(f, f)}_tiny.yaml"))["model"]["tiny"][
        "transformer"] for f in {**REAL, **video.REAL}}
