"""Rows of a batch, for the batch-invariance tests and the CPU probe (benchmarks/probe_batch_invariance.py).

A family's transformer inputs are captured from its own pipeline call (the first transformer call
of one denoising step, so CFG's concatenation and every family's extra inputs are the real ones),
then cut to any rows: `take_rows(inputs, [3, 0, 5], batch)` is what the transformer would have
been handed for a batch of those three rows. Per-row tensors are the ones whose first dimension is
the batch (CFG doubles it; the rows picked are then rows of the doubled batch), and per-row lists
(Z-Image's pipeline hands its transformer a list of latents and one of captions, each row's at its
own length: the transformer pads them to the batch's longest itself).
"""

from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import torch

from jobs.models.base import DenoiseRequest

PROMPTS = [f"a {c} {s} on a {b} background" for c, s, b in [
    ("red", "star", "blue"), ("green", "circle", "white"), ("yellow", "square", "black"),
    ("blue", "triangle", "grey"), ("white", "heart", "red"), ("black", "moon", "yellow"),
    ("pink", "cross", "green"), ("orange", "ring", "purple")]] * 2


def request(fam, pipe, cfg, rows: Sequence[int], steps: int = 1, guidance: float = 4.5,
            prompts: Sequence[str] = PROMPTS) -> DenoiseRequest:
    """A DenoiseRequest for prompts[rows] with seeds 100+row. The prompts are encoded once, as one
    batch, and every request takes its rows of that encoding: the rows a test compares get the very
    same embeddings in every batch (the text encoder is not what these tests batch)."""
    pos, neg = _encoded(fam, pipe, cfg, tuple(prompts))
    idx = torch.tensor(list(rows))
    s = cfg.sampling
    return DenoiseRequest(positive=_rows(pos, idx), negative=_rows(neg, idx) if neg is not None else None,
                          seeds=[100 + r for r in rows], height=s.height, width=s.width,
                          steps=max(steps, MIN_STEPS.get(fam.name, 1)),
                          guidance_scale=guidance if fam.guidance else 1.0,
                          num_frames=getattr(s, "num_frames", 1) or 1, fps=float(getattr(s, "fps", 16.0) or 16.0),
                          prompts=[prompts[r] for r in rows])  # GLM-Image's prior reads the text


#: MiniMaxH3Scheduler.set_timesteps refuses one step (the first transformer call is all that is taken)
MIN_STEPS = {"minimax_h3": 2}


_ENCODED: dict = {}


def _encoded(fam, pipe, cfg, prompts: tuple):
    key = (id(pipe), prompts)
    if key not in _ENCODED:
        with torch.inference_mode():
            pos = fam.encode(pipe, list(prompts), cfg.model, "cpu", instruction=True)
            neg = fam.encode(pipe, [""] * len(prompts), cfg.model, "cpu", instruction=True) if fam.guidance else None
        _ENCODED[key] = (pipe, pos, neg)  # the pipe is held so its id is not reused
    return _ENCODED[key][1:]


def _rows(side, idx):
    return type(side)(embeds=side.embeds[idx], mask=None if side.mask is None else side.mask[idx],
                      extras={k: v[idx] for k, v in side.extras.items()})


def transformer_inputs(fam, pipe, cfg, n: int = 16, prompts: Sequence[str] = PROMPTS) -> Tuple[tuple, dict, int]:
    """(args, kwargs, batch) of the first transformer call for prompts[:n], detached clones."""
    calls: list = []

    def grab(module, args, kwargs):
        if not calls:
            calls.append(_clone((args, kwargs)))
        raise _Stop

    tr = fam.transformer(pipe)
    h = tr.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        with torch.inference_mode():
            fam.denoise(pipe, request(fam, pipe, cfg, list(range(n)), prompts=prompts))
    except _Stop:
        pass
    finally:
        h.remove()
    args, kwargs = calls[0]
    hidden = kwargs.get("hidden_states", args[0] if args else None)
    # Z-Image's pipeline hands its transformer a list of per-row latents (and captions)
    return args, kwargs, len(hidden) if isinstance(hidden, list) else int(hidden.shape[0])


class _Stop(Exception):
    """Raised by the capture hook: one transformer call is all that is needed."""


def _clone(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, (list, tuple)):
        return type(obj)(_clone(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    return obj


def take_rows(obj: Any, rows: List[int], batch: int) -> Any:
    """`obj` as it would be for a batch of `rows` (indices into the captured batch)."""
    if isinstance(obj, torch.Tensor):
        if obj.dim() and obj.shape[0] == batch:
            return obj[torch.tensor(rows)].contiguous()
        return obj
    if isinstance(obj, (list, tuple)) and len(obj) == batch and batch > 1:
        return type(obj)(obj[r] for r in rows)
    if isinstance(obj, (list, tuple)):
        return type(obj)(take_rows(o, rows, batch) for o in obj)
    if isinstance(obj, dict):
        return {k: v if k in NOT_PER_ROW else take_rows(v, rows, batch) for k, v in obj.items()}
    return obj


#: keyword arguments that are per token, never per row, whatever their first dimension: GLM-Image's
#: rotary table at 64 px is [16 tokens, 8], the same first dimension as a captured batch of 16
NOT_PER_ROW = {"image_rotary_emb"}


def run_transformer(tr, args, kwargs) -> torch.Tensor:
    with torch.inference_mode():
        out = tr(*args, **{**kwargs, "return_dict": False})
    if isinstance(out, tuple) and len(out) > 1 and all(isinstance(o, torch.Tensor) for o in out):
        # LTX-2 and MiniMax-H3 return (video, audio): a row's output is both, flattened side by side
        return torch.cat([o.flatten(1) for o in out], dim=1)
    out = out[0] if isinstance(out, (tuple, list)) else out
    # Z-Image's transformer returns a list of per-row outputs, all of one shape: stacked, row-first
    return torch.stack(out) if isinstance(out, list) else out
