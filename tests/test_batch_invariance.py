"""The batch-invariance contract on the CPU (issue 30): with bcg.invariant's mode on, a row's
output bytes do not depend on the batch size, its neighbours or its position.

Real diffusers modules of the tiny presets (SANA's trained weights, seeded random ones for the
others); inputs are those of each family's own pipeline call (tests/invariance_rows.py). Equality
is bitwise (`torch.equal`): the contract is bytes, and no tolerance is needed, since every compared
row goes through kernels of one fixed shape. It holds for any thread count; the bytes themselves
may differ between 1 and 2 threads, which the contract allows.
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import pytest
import torch

from bcg.invariant import InvariantConfig, active, batch_invariant, compare_rows, install_batch_invariance
from bcg.invariant import cpu as inv_cpu
from jobs.worker.outputs import tensors_of
from tests.helpers import tiny_pipeline
from tests.invariance_rows import PROMPTS, request, run_transformer, take_rows, transformer_inputs

FAMILIES = ["sana_tiny", "flux_tiny", "qwen_image_tiny", "z_image_tiny", "longcat_image_tiny", "sana_video_tiny",
            # video + audio: a row's output is both, side by side (run_transformer); GLM-Image runs CFG
            # as two calls, so its captured batch is the 16 conditional rows
            "ltx2_tiny", "glm_image_tiny", "minimax_h3_tiny"]
#: the families whose forward the op-by-op trace can follow from batch 1 to 16: Z-Image's loops over
#: its rows in Python (patchify, the unified sequence), so batch 1 and 16 run other op sequences
TRACED = [f for f in FAMILIES if f != "z_image_tiny"]
#: the families whose transformer rows depend on their position at one batch shape without the mode,
#: on a CPU of more than one thread: GLM-Image's tiny config, through torch's CPU flash attention
#: (test_glm_image_misses_one_shape_only_through_the_cpu_flash_attention)
THREAD_BOUND_AT_ONE_SHAPE = {"glm_image_tiny"}
#: the aten ops the mode replaces on the CPU, as a TorchDispatchMode sees them under inference_mode
#: (linear and conv2d decompose into the replaced mm/addmm and convolution)
REPLACED = {"aten.linear.default", "aten.mm.default", "aten.addmm.default", "aten.bmm.default",
            "aten.baddbmm.default", "aten.matmul.default", "aten.conv2d.default", "aten.conv3d.default",
            "aten.convolution.default", "aten.einsum.default", "aten.group_norm.default",
            "aten.silu.default", "aten.gelu.default", "aten.tanh.default", "aten.sigmoid.default", "aten.exp.default",
            "aten.scaled_dot_product_attention.default"}



@pytest.fixture(scope="module")
def built():
    cache = {}

    def get(preset):
        if preset not in cache:
            # 64 px: SANA's 128-px default would be 4x the tokens, and the CPU mode's GEMM is a gemv a row
            cfg, fam, pipe = tiny_pipeline(preset, "sampling.height=64", "sampling.width=64")
            args, kw, batch = transformer_inputs(fam, pipe, cfg, 16)
            cache[preset] = (cfg, fam, pipe, args, kw, batch)
        return cache[preset]

    return get


def outputs(tr, args, kw, batch, rows):
    return run_transformer(tr, *take_rows((args, kw), rows, batch))


@pytest.mark.parametrize("preset", FAMILIES)
def test_transformer_row_is_the_same_alone_in_any_batch_at_any_position(built, preset):
    cfg, fam, pipe, args, kw, batch = built(preset)
    tr = fam.transformer(pipe)
    with batch_invariant() as inv:
        alone = {r: outputs(tr, args, kw, batch, [r]) for r in range(8)}
        # batch sizes 1 (alone), 2, 3, 8 and 16; in the batch of 8 each of the 8 positions holds a row
        # also run alone; the last batch puts row 3 at the end, among rows it never met before
        for rows in ([0, 1], [0, 1, 2], [7, 6, 5, 4, 3, 2, 1, 0], list(range(16)), [9, 12, 3]):
            got = outputs(tr, args, kw, batch, rows)
            bad = [(i, r) for i, r in enumerate(rows) if r in alone and not torch.equal(got[i:i + 1], alone[r])]
            assert not bad, f"{preset}: in a batch of {len(rows)}, (position, row) {bad} differ from the row alone"
        assert inv.calls["cpu.addmm"] + inv.calls["cpu.mm"] > 0  # the replacements really ran


@pytest.mark.parametrize("preset", [*FAMILIES, "wan_tiny"])
def test_with_the_mode_off_a_row_is_the_same_at_one_batch_shape(built, preset):
    # The default's contract (one pool size: [8] for images, [1] for the video presets): at one
    # batch shape a row's bytes do not depend on its position or its neighbours, without the mode.
    # GLM-Image's tiny config keeps it on one thread only (the test below says why and pins the cause).
    cfg, fam, pipe, args, kw, batch = built(preset)
    with one_thread() if preset in THREAD_BOUND_AT_ONE_SHAPE else contextlib.nullcontext():
        bad = moved_rows(fam.transformer(pipe), args, kw, batch)
    assert not bad, f"{preset}: at batch 8, (position, row) {bad} differ from the row at another position"


def test_glm_image_misses_one_shape_only_through_the_cpu_flash_attention(built):
    # On this 2-thread CPU (torch 2.13, AVX-512), 7 of GLM-Image tiny's 8 rows changed with their
    # position at batch 8. The cause is torch's CPU flash-attention kernel: at head dim 8 and an odd
    # sequence of 9 to 31 tokens (GLM-Image tiny: 1 glyph token and 16 image tokens), a (batch, head)
    # item's bytes depend on how the items are shared among threads; on one thread, or at the other
    # head dims tried (4, and 12 to 128; the released GLM-Image's is 40), no item's did. So through
    # the math backend, at any thread count, every row keeps its bytes: nothing else in the model
    # depends on its position.
    from torch.nn.attention import SDPBackend, sdpa_kernel

    cfg, fam, pipe, args, kw, batch = built("glm_image_tiny")
    assert fam.transformer(pipe).config.attention_head_dim == 8  # the shape the kernel misses at
    with sdpa_kernel(SDPBackend.MATH):
        assert not moved_rows(fam.transformer(pipe), args, kw, batch)


def moved_rows(tr, args, kw, batch) -> list:
    """(position, row) pairs whose output at batch 8 differs from the same row's at another position:
    each row of rows 0-7 reversed, and among other neighbours (rows 8-15 around it)."""
    ref = outputs(tr, args, kw, batch, list(range(8)))
    bad = []
    for rows in ([7, 6, 5, 4, 3, 2, 1, 0], [8, 9, 0, 10, 11, 12, 13, 5], [3, 15, 14, 13, 12, 11, 10, 9]):
        got = outputs(tr, args, kw, batch, rows)
        bad += [(i, r) for i, r in enumerate(rows) if r < 8 and not torch.equal(got[i:i + 1], ref[r:r + 1])]
    return bad


@contextlib.contextmanager
def one_thread():
    """torch's intra-op threads set to 1 for the block (the contract allows bytes to depend on the
    thread count, not on the position at a given count)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("preset", TRACED)
def test_with_the_mode_off_only_replaced_ops_change_a_row(built, preset):
    # What each family misses without the mode, pinned op by op: where a row's output differs between
    # batch 1 and 16 (on most CPUs: a GEMM for M = 1 is a gemv), every op that computes the same row
    # differently is one the mode replaces: nothing else in these models depends on the batch. Whether it
    # differs at all is the CPU's kernels' choice: on the 2026-12-05 development machine's Xeon,
    # MiniMax-H3's tiny transformer gave row 0 the same bytes at batch 16 (no op moved it), where the
    # machines before gave other bytes; the seven other families moved there too.
    cfg, fam, pipe, args, kw, batch = built(preset)
    tr = fam.transformer(pipe)
    # one plain call first: Qwen-Image caches its RoPE tables (lru_cache), and run alone (-k) this test
    # traced a cold reference against a warm batch 16, whose op sequences part at op 38
    run_transformer(tr, *take_rows((args, kw), [0], batch))
    rep = compare_rows(lambda a: run_transformer(tr, *a), take_rows((args, kw), [0], batch),
                       take_rows((args, kw), list(range(16)), batch))
    assert rep.sequence_break is None, rep.sequence_break
    assert rep.compared > 100 and rep.uncompared == 0
    assert set(rep.origin_ops()) <= REPLACED, rep.origin_ops()
    assert rep.outputs_equal or rep.origins, f"{preset}: row 0 moved at batch 16 with no op found that moved it"


def test_row_is_the_same_when_the_weights_do_not_require_grad(built):
    # aten's matmul (so a linear) makes [B, S, K] @ [K, N] one mm where the weight requires grad or
    # the input's strides allow it without a copy, else a bmm of the weight broadcast over B. LongCat's
    # attention outputs take a slice of the joint text + image sequence: at batch 1 that is
    # contiguous (addmm), at 16 it is not, and with weights that do not require grad (a frozen
    # model) it went through bmm, and row 0 changed. The mode computes bmm rows as mm's.
    cfg, fam, pipe, args, kw, batch = built("longcat_image_tiny")
    tr = fam.transformer(pipe)
    tr.requires_grad_(False)
    try:
        with batch_invariant() as inv:
            alone = outputs(tr, args, kw, batch, [0])
            assert torch.equal(outputs(tr, args, kw, batch, list(range(16)))[:1], alone)
        assert inv.calls["cpu.bmm"] > 0  # the unfolded path ran
    finally:
        tr.requires_grad_(True)


#: captions of 229 tokens (256 with Z-Image's padding to 32) and of 512 (cut at max_sequence_length)
LONG = ["a long prompt about " + " ".join(["a quiet red fox by a misty lake at dawn"] * n) for n in (20, 60)]


def test_z_image_row_is_the_same_among_longer_captions(built):
    # ZImagePipeline hands its transformer each row's caption at its own length, and the transformer
    # pads the batch to its longest row (image and caption tokens) with a key mask: among longer
    # captions a row's attention has more keys, masked, than alone. The mode's CPU attention cuts
    # every item's masked trailing keys, so the row's call is its call alone. (In the job a batch
    # is one caption length, padding/z_image.py; this is the pipeline's own contract.)
    cfg, fam, pipe, *_ = built("z_image_tiny")
    args, kw, batch = transformer_inputs(fam, pipe, cfg, 3, prompts=[PROMPTS[0], *LONG])
    lengths = [len(c) for c in args[2]]  # CFG: 3 positive rows, then their 3 negative ones
    assert batch == 6 and lengths[0] == 32 and 224 < lengths[1] <= 256 and lengths[2] == 512, lengths
    tr = fam.transformer(pipe)
    with batch_invariant() as inv:
        alone = {r: outputs(tr, args, kw, batch, [r]) for r in range(batch)}
        for rows in ([0, 2], [2, 1], [1, 0, 2], [5, 4, 3, 2, 1, 0]):
            got = outputs(tr, args, kw, batch, rows)
            bad = [(i, r) for i, r in enumerate(rows) if not torch.equal(got[i:i + 1], alone[r])]
            assert not bad, f"in a batch of {len(rows)}, (position, row) {bad} differ from the row alone"
        assert inv.calls["cpu.sdpa"] > 0 and "cpu.sdpa.fallback" not in inv.calls
    # what the attention replacement is for, on this CPU: without it, the 229-token row's bytes
    # follow the 512-token neighbour (the flash kernel sums 576 keys, 256 of them masked, in other blocks)
    with batch_invariant(InvariantConfig(attention_cpu=False)):
        assert not torch.equal(outputs(tr, args, kw, batch, [2, 1])[1:2], outputs(tr, args, kw, batch, [1]))


#: the families whose whole path (denoise, then decode) is checked row by row at batch sizes 1 to 16,
#: in latents and in image (video, sound) bytes: all but GLM-Image, whose autoregressive prior makes
#: its whole path take 105 s here at batch 16 (its DiT and VAE rows are checked above and below)
WHOLE_PATH = ["sana_tiny", "flux_tiny", "qwen_image_tiny", "z_image_tiny", "longcat_image_tiny", "wan_tiny",
              "sana_video_tiny", "ltx2_tiny", "minimax_h3_tiny"]


@pytest.mark.parametrize("preset", WHOLE_PATH)
def test_latents_and_pixels_do_not_depend_on_the_batch(built, preset):
    # The job's own stages (fam.denoise, fam.decode), 2 steps: rows 0 and 5 alone, then in batches of
    # 2, 3, 8 and 16 at other positions, among other neighbours.
    cfg, fam, pipe, *_ = built(preset)
    with batch_invariant():
        with torch.inference_mode():
            def run(rows):
                req = request(fam, pipe, cfg, rows, steps=2)
                lat = fam.denoise(pipe, req)
                return lat, fam.decode(pipe, lat, req)

            alone = {r: run([r]) for r in (0, 5)}
            for rows in ([5, 0], [1, 5, 0], [7, 6, 5, 4, 3, 2, 1, 0], list(range(16))):
                lat, px = run(rows)
                for r in alone:
                    i = rows.index(r)
                    where = f"{preset}: row {r} at {i} of {len(rows)}"
                    assert rows_equal(lat, i, len(rows), alone[r][0]), f"{where}: latents"
                    assert rows_equal(px, i, len(rows), alone[r][1]), f"{where}: pixels"


def leaves(out) -> list:
    """A stage's output flattened: the tensors the job hashes into `latent_sha256` (`tensors_of`:
    through tuples and lists, past generators and geometry), and a decode's `Decoded` fields,
    tensors or arrays."""
    if dataclasses.is_dataclass(out):
        return [x for f in dataclasses.fields(out) for x in leaves(getattr(out, f.name))]
    return [out] if isinstance(out, np.ndarray) else tensors_of(out)


def rows_equal(batch_out, i: int, n: int, alone_out) -> bool:
    """Whether row i of a batch of n (every leaf whose first dimension is n) has the bytes of the
    same row's output alone, leaf for leaf."""
    got, want = leaves(batch_out), leaves(alone_out)
    per_row = [k for k, x in enumerate(got) if x.shape and x.shape[0] == n]
    assert len(got) == len(want) and per_row, (len(got), len(want), per_row)
    for k in per_row:
        a, b = got[k][i:i + 1], want[k]
        if not (torch.equal(a, b) if isinstance(a, torch.Tensor) else np.array_equal(a, b) and a.dtype == b.dtype):
            return False
    return True


# one preset a VAE class: Z-Image and LongCat-Image decode with Flux's AutoencoderKL, SANA-Video with
# Wan's AutoencoderKLWan (Qwen-Image's AutoencoderKLQwenImage: the probe, benchmarks/results)
@pytest.mark.parametrize("preset", ["sana_tiny", "flux_tiny", "sana_video_tiny"])
def test_vae_decode_row_is_the_same_in_any_batch(built, preset):
    cfg, fam, pipe, *_ = built(preset)
    shape = {"sana_tiny": (8, 16, 16), "flux_tiny": (4, 16, 16), "sana_video_tiny": (16, 3, 8, 8)}[preset]
    z = torch.randn(4, *shape, generator=torch.Generator().manual_seed(1))

    def decode(x):
        with torch.inference_mode():
            return pipe.vae.decode(x, return_dict=False)[0]

    with batch_invariant():
        full = decode(z)
        for r in (0, 3):
            assert torch.equal(decode(z[r:r + 1]), full[r:r + 1]), f"{preset}: VAE row {r}"
        assert torch.equal(decode(z[[2, 1]])[1:], full[1:2])  # another batch, another position


#: the video + audio families' decoders (their classes are new): the video VAE, LTX-2's audio VAE (to a
#: mel spectrogram) and vocoder, MiniMax-H3's audio VAE; one row's latent shape (as the probe's)
DECODERS = {("ltx2_tiny", "vae"): (8, 3, 8, 8), ("ltx2_tiny", "audio_vae"): (2, 14, 2),
            ("ltx2_tiny", "vocoder"): (2, 53, 8), ("minimax_h3_tiny", "vae"): (4, 5, 4, 4),
            ("minimax_h3_tiny", "audio_vae"): (4, 8)}


@pytest.mark.parametrize("preset,part", list(DECODERS))
def test_video_and_audio_decoder_row_is_the_same_in_any_batch(built, preset, part):
    cfg, fam, pipe, *_ = built(preset)
    module = getattr(pipe, part)
    z = torch.randn(4, *DECODERS[preset, part], generator=torch.Generator().manual_seed(1))

    def decode(x):
        with torch.inference_mode():
            return module(x) if part == "vocoder" else module.decode(x, return_dict=False)[0]

    with batch_invariant() as inv:
        full = decode(z)
        for r in (0, 3):
            assert torch.equal(decode(z[r:r + 1]), full[r:r + 1]), f"{preset} {part}: row {r}"
        assert torch.equal(decode(z[[2, 1]])[1:], full[1:2])  # another batch, another position
    assert inv.calls["cpu.convolution"] > 0


# -- the mechanism ------------------------------------------------------------------------------

def test_cpu_gemm_rows_are_computed_alone():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(70, 48, generator=g), torch.randn(48, 40, generator=g)
    full = inv_cpu.mm(a, b, rows=16)  # 70 rows: four full chunks and a padded one
    for r in (0, 15, 16, 69):
        assert torch.equal(inv_cpu.mm(a[r:r + 1], b, rows=16), full[r:r + 1])
    assert torch.allclose(full, a @ b, atol=1e-5)
    x, y = torch.randn(11, 5, 48, generator=g), torch.randn(11, 48, 7, generator=g)
    fb = inv_cpu.bmm(x, y)
    assert torch.equal(inv_cpu.bmm(x[9:10], y[9:10]), fb[9:10])
    # an item's rows are mm's rows: a linear has one value whether matmul folded it into an mm or not
    assert torch.equal(fb[9], inv_cpu.mm(x[9], y[9]))
    assert torch.equal(inv_cpu.bmm(x, y[:1].expand(11, 48, 7)), inv_cpu.mm(x.reshape(55, 48), y[0]).view(11, 5, 7))
    assert torch.allclose(fb, x @ y, atol=1e-5)


def test_install_and_remove_give_aten_back():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 64, generator=g), torch.randn(64, 32, generator=g)
    before = torch.mm(a, b)
    inv = install_batch_invariance()
    try:
        assert active() is inv
        with pytest.raises(RuntimeError, match="already installed"):
            install_batch_invariance()
        on = torch.nn.functional.linear(a, b.t(), torch.ones(32))
        assert inv.calls["cpu.addmm"] == 1
        assert torch.equal(on, inv_cpu.mm(a, b) + 1)
        assert torch.equal(torch.mm(a.double(), b.double()), a.double() @ b.double())  # a counted fallback
        assert inv.calls["cpu.mm.fallback"] >= 1
    finally:
        inv.remove()
    assert active() is None and torch.equal(torch.mm(a, b), before)
    with batch_invariant(InvariantConfig(conv=False)) as inv2:
        torch.nn.functional.conv2d(torch.randn(2, 3, 5, 5), torch.randn(4, 3, 3, 3))
        assert "cpu.convolution" not in inv2.calls
    assert active() is None


@pytest.mark.parametrize("op", [torch.nn.functional.silu, torch.sigmoid, torch.tanh, torch.exp,
                                lambda t: torch.nn.functional.gelu(t, approximate="tanh")])
def test_transcendental_ops_take_one_path_whatever_the_numel(op):
    # [1, 24] runs the scalar tail for 8 of its 24 elements, [16, 24] runs them all vectorised
    # (Wan's timestep embedding: silu's row 0 differed between batch 1 and 16 on this CPU)
    x = torch.randn(16, 24, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode(), batch_invariant() as inv:
        full = op(x)
        for r in (0, 3, 15):
            assert torch.equal(op(x[r:r + 1].clone()), full[r:r + 1])
        assert torch.equal(op(x[:3]), full[:3])
    assert sum(inv.calls.values()) == 5 and not any(k.endswith("fallback") for k in inv.calls)
    assert torch.allclose(full, op(x), atol=1e-6)  # the same function (mode off now)


@pytest.mark.parametrize("cross", [False, True])
def test_cpu_attention_row_is_its_call_alone_whatever_the_key_padding(cross):
    # A row of 200 keys alone, and padded to 352 / 576 keys (a masked tail) among other rows:
    # the flash kernel's bits follow the key count (measured: 200 vs 320 keys differ), the mode's do not.
    g = torch.Generator().manual_seed(0)
    h, d, n = 2, 16, 200
    lq = 48 if cross else n  # cross-attention: the queries are not padded with the keys

    def rnd(*shape):
        return torch.randn(*shape, generator=g)

    q, k, v = rnd(1, h, lq, d), rnd(1, h, n, d), rnd(1, h, n, d)
    for pad, as_float in ((352, False), (576, True)):
        qp, kp, vp = rnd(3, h, pad if not cross else lq, d), rnd(3, h, pad, d), rnd(3, h, pad, d)
        qp[1, :, :lq], kp[1, :, :n], vp[1, :, :n] = q[0], k[0], v[0]
        keep = torch.ones(3, 1, 1, pad, dtype=torch.bool)
        keep[1, ..., n:] = False
        keep[2, ..., pad // 3:] = False
        mask = torch.where(keep, 0.0, float("-inf")) if as_float else keep
        with torch.inference_mode(), batch_invariant() as inv:
            alone = torch.nn.functional.scaled_dot_product_attention(q, k, v)
            big = torch.nn.functional.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask)
        assert torch.equal(big[1:2, :, :lq], alone), (pad, as_float)
        assert inv.calls["cpu.sdpa"] == 2
        ref = torch.nn.functional.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask)  # the mode off
        assert torch.allclose(big, ref, atol=1e-6)
    # a gradient is aten's (its composite runs instead, counted as a fallback)
    qg = q.clone().requires_grad_()
    with batch_invariant() as inv:
        torch.nn.functional.scaled_dot_product_attention(qg, k, v).sum().backward()
    want = q.clone().requires_grad_()
    torch.nn.functional.scaled_dot_product_attention(want, k, v).sum().backward()
    assert inv.calls["cpu.sdpa.fallback"] == 1 and torch.equal(qg.grad, want.grad)


def test_trace_judges_an_in_place_op_on_its_inputs_before_it_ran():
    # LTX-2's split RoPE writes into slices with addcmul_: read after it ran, its `self` already held
    # its result, so wherever a difference reached it from upstream the isolation re-ran it on that
    # result and called it an origin (32 false origins in LTX-2's trace). The scale is the origin here.
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))

    def fn(a):
        y = a * float(a.shape[0]) / 3.0  # row 0's bits depend on the batch size: an origin
        y[:, :4].addcmul_(y[:, 4:], y[:, 4:])
        return y

    rep = compare_rows(fn, x[:1], x)
    assert not rep.outputs_equal and rep.first_difference is not None
    assert "aten.addcmul_.default" not in rep.origin_ops(), rep.origin_ops()
    assert rep.origins and rep.origins[0].index == rep.first_difference[0]
