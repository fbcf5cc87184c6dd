"""GLM-Image lossless fusions on the CPU (reference backend): the fused GlmImageTransformerBlock and final
GlmImageAdaLayerNormContinuous on a real tiny GlmImageTransformer2DModel (conf/model/glm_image_tiny.yaml's
transformer) leave its output bit-identical, in fp32 and bf16, with and without a text mask, every block
and the final norm verified as a whole against their own forwards; the chains (LayerNorm + adaLN, gated
residual + LayerNorm + adaLN, gated residuals, the q / k LayerNorm + rotate-half RoPE into the image
slice) verified against eager; a rotary table whose halves differ runs eager's rotation (the kernel
reads one cos / sin a pair); calls the forward does not cover (a KV cache, attention kwargs) run the
class's forward once; and under bcg's CPU op tape, with the family's graph-friendly calls, the fused
model captures and replays eager's bits."""

from __future__ import annotations

import pytest
import torch

from bcg import RunnerConfig, apply_graph_runner
from bcg.fusions import OPS, RULES, install_fusions

# conf/model/glm_image_tiny.yaml's transformer
TINY = dict(patch_size=2, in_channels=4, out_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=2,
            text_embed_dim=32, time_embed_dim=16, condition_dim=8, prior_vq_quantizer_codebook_size=64)


def tiny_model(dtype, config=None):
    from diffusers import GlmImageTransformer2DModel

    torch.manual_seed(0)
    model = GlmImageTransformer2DModel(**(TINY if config is None else config))
    # every LayerNorm of the DiT is affine-free (the blocks', the q / k norms, norm_out's): no norm
    # weight to randomise; the rule's check requires it
    assert not any("norm" in n and n.endswith(("norm.weight", "norm_q.weight", "norm_k.weight"))
                   for n, _ in model.named_parameters())
    return model.to(dtype).eval().requires_grad_(False)


def tiny_inputs(dtype, batch=2, text=5, side=8, seed=0, mask=False, config=None, **kw):
    """A DiT call as GlmImagePipeline makes it: latents [B, C, side, side], glyph embeddings, the prior's
    tokens (upsampled to the DiT's patch grid) with a drop mask (the unconditional branch drops them),
    the timestep, target size and crop coordinates. `config`: the model's (default: TINY)."""
    c = TINY if config is None else config
    g = torch.Generator().manual_seed(seed)
    n = (side // c["patch_size"]) ** 2
    drop = torch.zeros(batch, n, dtype=torch.bool)
    drop[batch // 2:] = True
    inputs = dict(hidden_states=torch.randn(batch, c["in_channels"], side, side, generator=g).to(dtype),
                  encoder_hidden_states=torch.randn(batch, text, c["text_embed_dim"], generator=g).to(dtype),
                  prior_token_id=torch.randint(0, c["prior_vq_quantizer_codebook_size"], (batch, n), generator=g),
                  prior_token_drop=drop, timestep=torch.full((batch,), 500.0),
                  target_size=torch.tensor([[side * 8.0, side * 8.0]] * batch), crop_coords=torch.zeros(batch, 2),
                  return_dict=False, **kw)
    if mask:
        m = torch.ones(batch, text)
        m[0, : text // 2] = 0
        inputs["attention_mask"] = m
    return inputs


def _run(model, cases):
    return [model(**kw)[0] for kw in cases]


def _verdicts(fx) -> tuple[set, set]:
    state = fx.verifier.state
    return {k[0] for k, ok in state.items() if ok}, {k[0] for k, ok in state.items() if not ok}


def _fused(model) -> list:
    return list(model.transformer_blocks) + [model.norm_out]


@pytest.mark.parametrize("dtype, grad_mode", [(torch.float32, torch.no_grad), (torch.bfloat16, torch.inference_mode)])
def test_fused_blocks_equal_eager_and_leave_model_code(dtype, grad_mode):
    from diffusers.models.transformers import transformer_glm_image as T

    forwards = (T.GlmImageTransformerBlock.forward, T.GlmImageAdaLayerNormContinuous.forward)
    model = tiny_model(dtype)
    cases = [tiny_inputs(dtype), tiny_inputs(dtype, batch=1, text=3, side=4, seed=1, mask=True)]
    with grad_mode():
        refs = _run(model, cases)
        fx = install_fusions(model, backend="reference")
        rules = [r for r, _, _ in fx.installed]
        assert rules.count("glm_image_block") == len(model.transformer_blocks)
        assert rules.count("glm_image_norm_out") == 1
        outs = [_run(model, cases) for _ in range(2)]  # first sight verifies, then fused
        assert fx.remove() == len(_fused(model))
        after = _run(model, cases[:1])
    assert (T.GlmImageTransformerBlock.forward, T.GlmImageAdaLayerNormContinuous.forward) == forwards
    assert all("forward" not in m.__dict__ for m in _fused(model))
    for again in outs:
        assert all(torch.equal(o, r) for o, r in zip(again, refs))
    assert torch.equal(after[0], refs[0])
    c = fx.counters
    # every block and the final norm, for both input keys
    assert c.forwards_verified == 2 * len(_fused(model)) and c.forwards_rejected == 0, c.rejections
    assert c.rejected == 0 and c.not_applicable == 0 and c.fused_calls > 0, c
    verified, not_here = _verdicts(fx)
    assert {"ln_adaln", "gated_res_ln_adaln", "gated_residual", "qk_glm_split_plain"} <= verified, verified
    assert not not_here, not_here
    # the rules list every chain their forwards ran
    ops = set(RULES["glm_image_block"].ops) | set(RULES["glm_image_norm_out"].ops)
    assert ops <= set(OPS) and verified - {"forward"} <= ops


def test_a_table_passed_in_whatever_its_values_stays_fused_and_exact():
    """The kernel reads one cos / sin a rotate-half pair; the rule calls it once a half, so a table whose
    halves differ (not GlmImageRotaryPosEmbed's: a graph replays whatever table it is handed) is as
    exact as the model's own, passed in as the family's graph-friendly calls pass it."""
    model = tiny_model(torch.float32)
    kw = tiny_inputs(torch.float32)
    cos, sin = model.rope(kw["hidden_states"])
    h = cos.shape[1] // 2
    assert torch.equal(cos[:, :h], cos[:, h:])  # the model's own repeats its halves
    odd = (cos + 0.25 * torch.rand(cos.shape), sin - 0.25 * torch.rand(sin.shape))
    assert not torch.equal(odd[0][:, :h], odd[0][:, h:])
    with torch.no_grad():
        refs = [model(**kw, image_rotary_emb=t)[0] for t in ((cos, sin), odd)]
        fx = install_fusions(model, backend="reference")
        outs = [model(**kw, image_rotary_emb=t)[0] for t in ((cos, sin), odd, odd, (cos, sin))]
        fx.remove()
    assert all(torch.equal(o, r) for o, r in zip(outs, refs + refs[::-1]))
    c = fx.counters
    # one key (the tables' shapes): verified once per module, then fused for both tables
    assert c.forwards_verified == len(_fused(model)) and c.forwards_rejected == 0, c.rejections
    assert c.rejected == 0 and c.not_applicable == 0 and c.eager_calls == 0, c
    verified, not_here = _verdicts(fx)
    assert "qk_glm_split_plain" in verified and not not_here


def test_calls_the_forward_does_not_cover_run_the_class_forward_once():
    """A KV cache (image-to-image's write / read) and attention kwargs: the class's forward, called
    once (a cache stores once), equal to eager; other processors keep the module's forward."""
    from diffusers.models.transformers.transformer_glm_image import GlmImageKVCache

    model = tiny_model(torch.float32)
    kw = tiny_inputs(torch.float32)
    calls = [0]
    for blk in model.transformer_blocks:
        blk.attn1.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))

    def cached(mode):
        cache = GlmImageKVCache(num_layers=TINY["num_layers"])
        cache.set_mode(mode)
        return cache

    with torch.no_grad():
        write = cached("write")
        ref = model(**kw, kv_caches=write)[0]
        ref_read = model(**kw, kv_caches=_as_mode(write, "read"))[0]
        fx = install_fusions(model, backend="reference")
        calls[0] = 0
        write2 = cached("write")
        got = model(**kw, kv_caches=write2)[0]
        got_read = model(**kw, kv_caches=_as_mode(write2, "read"))[0]
        assert calls[0] == 2 * TINY["num_layers"]  # the class's forward, once a call
        model(**kw)  # first sight: the class's forward runs beside the fused one (the guard compares them)
        calls[0] = 0
        model(**kw)
        assert calls[0] == 0  # covered, verified: the processor inlined
        fx.remove()
    assert torch.equal(got, ref) and torch.equal(got_read, ref_read)
    assert all(len(a.k_caches) == len(b.k_caches) for a, b in zip(write.caches, write2.caches))
    blk = model.transformer_blocks[0]
    assert RULES["glm_image_block"].check(blk) is None
    blk.attn1.processor = type("OtherProcessor", (), {"__call__": lambda *a, **k: None})()
    assert "GlmImageAttnProcessor" in RULES["glm_image_block"].check(blk)


def _as_mode(cache, mode):
    cache.set_mode(mode)
    return cache


def test_fused_glm_image_captures_and_replays_on_the_tape():
    """Under bcg's CPU op tape (the CUDA graph's stand-in), with the family's graph-friendly calls (the
    rotary table made once per grid and passed in, the drop mask as `where`): capture after eager
    warm-ups, replays, every output eager's bits, the rotation fused, with the attention kernels as
    breaks."""
    from jobs.models.glm_image import _GraphFriendlyCalls, capturable_class

    model = tiny_model(torch.float32)
    model.__class__ = capturable_class(type(model))
    model.register_forward_pre_hook(_GraphFriendlyCalls(), with_kwargs=True)
    cases = [tiny_inputs(torch.float32, seed=s) for s in range(2)]
    with torch.no_grad():
        refs = _run(model, cases)
        fx = install_fusions(model, backend="reference")
        runner = apply_graph_runner(model, RunnerConfig(backend="tape", fusions="off"), break_policy="attention")
        try:
            outs = _run(model, cases + cases)
            stats = runner.stats()
        finally:
            runner.remove()
            fx.remove()
    assert all(torch.equal(o, r) for o, r in zip(outs, refs + refs))
    c = fx.counters
    assert stats["hits"] >= 2 and c.forwards_unverified_in_capture == 0 and c.unverified_in_capture == 0, (stats, c)
    assert c.forwards_rejected == 0 and c.rejected == 0 and c.not_applicable == 0, (c, fx.verifier.state)
    assert {e["breaks"] for e in stats["entries"]} == {TINY["num_layers"]}


_INTERPRETED = """
import json, torch
from bcg.fusions import Fusions, kernels_rope
from tests.test_fusions_glm_image import tiny_inputs, tiny_model
kernels_rope.EXPLICIT_TREE = True
model = tiny_model(torch.float32)
cases = [tiny_inputs(torch.float32, mask=True)]
with torch.no_grad():
    refs = [model(**kw)[0] for kw in cases]
    fx = Fusions(model, "triton")
    fx.verifier.cache = None  # no verdicts written to the user's cache
    fx.install()
    outs = [model(**kw)[0] for kw in cases + cases]
    fx.remove()
c = fx.counters
print("RESULT " + json.dumps(dict(equal=[torch.equal(o, r) for o, r in zip(outs, refs + refs)],
                                  not_applicable=c.not_applicable, forwards_rejected=c.forwards_rejected,
                                  forwards_verified=c.forwards_verified,
                                  rejected=sorted({r.split()[0] for r in c.rejections}),
                                  verified=sorted({k[0] for k, ok in fx.verifier.state.items() if ok}))))
"""


@pytest.mark.slow
def test_the_triton_launchers_apply_under_the_interpreter():
    """The GPU path's launchers (backend "triton") under Triton's CPU interpreter on the tiny model, batch 2
    with a text mask: every launcher applies to the layouts the forward hands it (none is
    "not applicable": the attention output's slices, the q / k image rows), the rotation equals eager, the
    output eager's bits. The LayerNorm kernel models aten's CUDA order, so on the CPU it differs from aten's
    CPU LayerNorm and is rejected (its fallback, the adaLN kernel after aten's norm, verifies)."""
    import json

    from tests.helpers import run_interpreted

    pytest.importorskip("triton")
    out = run_interpreted(_INTERPRETED)
    got = json.loads(next(x for x in out.splitlines() if x.startswith("RESULT "))[len("RESULT "):])
    assert all(got["equal"]) and got["not_applicable"] == 0 and got["forwards_rejected"] == 0, got
    assert got["forwards_verified"] == 3, got
    assert set(got["rejected"]) <= {"ln_adaln", "gated_res_ln_adaln"}, got
    assert {"qk_glm_split_plain", "gated_residual", "adaln"} <= set(got["verified"]), got
