"""Graph signatures: a hashable key built from a call's arguments, in microseconds.

A captured graph is valid only for calls that look like the capture call: same tensor shapes,
dtypes, devices and strides, and the same host values (a guidance scale or `return_dict` steers Python
control flow that the graph froze). The key therefore holds:

    tensor                     -> ("<T>", shape, dtype, device, strides)
    None / str                 -> the value
    bool / int / float         -> (type, value)   # 1 == 1.0 == True, but they may steer code apart
    torch.dtype / torch.device -> the value
    list / tuple / dict        -> (type, child keys); dict children sorted by key
    anything else              -> ("<obj>", type, id)

`flatten` walks the arguments once and returns the key and the tensor leaves in a fixed order
(positional arguments, then keyword arguments sorted by name, containers depth first); `rebuild`
walks the same order to put other tensors (static buffers, warm-up data) in their place.

Strides are part of the key because kernels choose their path by layout, and two paths need not
round alike: LTX-2's pipeline hands its batch-1 guidance calls a transposed view of the latents,
and cuBLAS on that view differs in the last bits from cuBLAS on a contiguous copy. The static
buffers keep the live strides too (`bcg/entry.py`), so a replay computes on the layout eager saw.

Fast paths: pipelines sometimes pass long lists of None (one passed 72,000 Nones a step and ran
4x slower). A list or tuple of at least `_RUN_MIN` items that is all None, all scalars of one
type, or all equal to a None-only first item is keyed in C-speed passes (`list.count`, `map`),
giving a compact key such as `(list, "<None*>", 72000)` instead of one entry per element.
"""

from __future__ import annotations

from typing import Any, Hashable, Iterator, TypeGuard

import torch

_TENSOR = "<T>"
_OBJECT = "<obj>"
_NONE_RUN = "<None*>"
_SCALAR_RUN = "<scalar*>"
_SAME_RUN = "<same*>"
_RUN_MIN = 16  # below this the per-item walk is as cheap as the checks

_SCALARS = (bool, int, float)
_SCALAR_SET = frozenset(_SCALARS) | {str}
_VALUE_TYPES = (torch.dtype, torch.device)

Key = Hashable  # one node of a call key (the table above)
# A call's key: (positional keys, (name, key) pairs sorted by name).
CallKey = tuple[tuple[Key, ...], tuple[tuple[str, Key], ...]]


def signature(args: tuple, kwargs: dict) -> CallKey:
    """The graph key of a call `f(*args, **kwargs)`."""
    return flatten(args, kwargs)[0]


def flatten(args: tuple, kwargs: dict) -> tuple[CallKey, list[torch.Tensor]]:
    """One pass: the call's key and its tensor leaves, in `rebuild`'s order."""
    leaves: list[torch.Tensor] = []
    arg_keys = tuple([_key(a, leaves) for a in args])
    kw_keys = tuple([(name, _key(kwargs[name], leaves)) for name in sorted(kwargs)])
    return (arg_keys, kw_keys), leaves


def rebuild(args: tuple, kwargs: dict, leaves: list[torch.Tensor]) -> tuple[tuple, dict]:
    """`args`/`kwargs` with their tensor leaves replaced, in order, by `leaves`."""
    it = iter(leaves)
    new_args = tuple([_put(a, it) for a in args])
    new_kwargs = {name: _put(kwargs[name], it) for name in sorted(kwargs)}
    # No leaf may be left over: flatten and rebuild must walk the same tree.
    assert next(it, None) is None, "rebuild got more leaves than the call holds"
    return new_args, {name: new_kwargs[name] for name in kwargs}


def _key(obj: Any, leaves: list) -> Key:
    t = type(obj)
    if t is torch.Tensor or isinstance(obj, torch.Tensor):
        leaves.append(obj)
        return (_TENSOR, obj.shape, obj.dtype, obj.device, obj.stride())
    if obj is None or t is str:
        return obj
    if t in _SCALARS:
        return (t, obj)
    if t is list or t is tuple or isinstance(obj, (list, tuple)):
        if len(obj) >= _RUN_MIN:
            run = _run_key(obj, t, leaves)
            if run is not None:
                return run
        return (t, tuple([_key(x, leaves) for x in obj]))
    if isinstance(obj, dict):
        return (t, tuple([(k, _key(obj[k], leaves)) for k in _dict_order(obj)]))
    if isinstance(obj, _VALUE_TYPES):
        return obj
    return (_OBJECT, t, id(obj))


def _run_key(seq: list | tuple, t: type, leaves: list) -> Key | None:
    """Compact key for a long homogeneous sequence, or None to walk it item by item."""
    n = len(seq)
    first = seq[0]
    n_leaves = len(leaves)
    try:
        if first is None:
            if seq[-1] is None and seq.count(None) == n:
                return (t, _NONE_RUN, n)
            return None
        ft = type(first)
        if ft in _SCALAR_SET:
            if type(seq[-1]) is ft and len(set(map(type, seq))) == 1:
                return (t, _SCALAR_RUN, ft, tuple(seq))
            return None
        if isinstance(first, (list, tuple)) and not isinstance(first, torch.Size):
            # Equality with a None-only first item pins every item to None-only content.
            inner = _key(first, leaves)
            if _none_only(inner) and seq.count(first) == n:
                return (t, _SAME_RUN, n, inner)
            del leaves[n_leaves:]  # the item-by-item walk collects them again
            return None
    except (TypeError, ValueError, RuntimeError):
        # An item whose __eq__ raises (numpy arrays, tensors) takes the item-by-item walk.
        del leaves[n_leaves:]
        return None
    return None


def _none_only(key: Key) -> bool:
    if key is None:
        return True
    if type(key) is not tuple:
        return False
    if len(key) == 2 and type(key[1]) is tuple and isinstance(key[0], type) and issubclass(
        key[0], (list, tuple)
    ):
        return all(_none_only(k) for k in key[1])
    if len(key) == 3 and key[1] == _NONE_RUN:
        return True
    return len(key) == 4 and key[1] == _SAME_RUN and _none_only(key[3])


def _dict_order(d: dict) -> list:
    try:
        return sorted(d)
    except TypeError:  # mixed key types: insertion order is still deterministic per call site
        return list(d)


def _put(obj: Any, it: Iterator[torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        return next(it)
    if isinstance(obj, (list, tuple)) and not isinstance(obj, torch.Size):
        items = [_put(x, it) for x in obj]
        if type(obj) is list or type(obj) is tuple:
            return type(obj)(items)
        if hasattr(obj, "_fields"):  # namedtuple
            return type(obj)(*items)
        return type(obj)(items)
    if isinstance(obj, dict):
        new = {k: _put(obj[k], it) for k in _dict_order(obj)}
        return type(obj)((k, new[k]) for k in obj) if type(obj) is not dict else {k: new[k] for k in obj}
    return obj


def describe_difference(a: CallKey, b: CallKey, limit: int = 8) -> list[str]:
    """Human lines naming the fields where call keys `a` and `b` differ, e.g.
    "encoder_hidden_states: shape (2, 64, 384) vs (2, 128, 384)"."""
    out: list[str] = []
    a_args, a_kw = a
    b_args, b_kw = b
    if len(a_args) != len(b_args):
        out.append(f"positional arguments: {len(a_args)} vs {len(b_args)}")
    for i, (x, y) in enumerate(zip(a_args, b_args)):
        _diff(f"args[{i}]", x, y, out)
    da, db = dict(a_kw), dict(b_kw)
    for name in sorted(set(da) | set(db)):
        if name not in da or name not in db:
            have = "absent vs present" if name not in da else "present vs absent"
            out.append(f"{name}: {have}")
        else:
            _diff(name, da[name], db[name], out)
    if len(out) > limit:
        out = out[:limit] + [f"... and {len(out) - limit} more"]
    return out


def _is_tensor_key(k: Key) -> TypeGuard[tuple[Any, ...]]:
    return type(k) is tuple and len(k) == 5 and k[0] == _TENSOR


def _is_container_key(k: Key) -> TypeGuard[tuple[Any, ...]]:
    return type(k) is tuple and len(k) == 2 and type(k[1]) is tuple and isinstance(k[0], type) \
        and issubclass(k[0], (list, tuple, dict))


def _diff(path: str, x: Key, y: Key, out: list[str]) -> None:
    if x == y:
        return
    if _is_tensor_key(x) and _is_tensor_key(y):
        for label, i in (("shape", 1), ("dtype", 2), ("device", 3), ("strides", 4)):
            if x[i] != y[i] and not (i == 4 and x[1] != y[1]):  # new shapes bring new strides: said once
                xs, ys = (tuple(x[i]), tuple(y[i])) if i in (1, 4) else (x[i], y[i])
                out.append(f"{path}: {label} {xs} vs {ys}")
        return
    if _is_container_key(x) and _is_container_key(y) and x[0] is y[0]:
        if issubclass(x[0], dict):
            dx, dy = dict(x[1]), dict(y[1])
            for k in list(dx) + [k for k in dy if k not in dx]:
                if k not in dx or k not in dy:
                    out.append(f"{path}[{k!r}]: {'absent vs present' if k not in dx else 'present vs absent'}")
                else:
                    _diff(f"{path}[{k!r}]", dx[k], dy[k], out)
            return
        if len(x[1]) != len(y[1]):
            out.append(f"{path}: length {len(x[1])} vs {len(y[1])}")
            return
        for i, (xi, yi) in enumerate(zip(x[1], y[1])):
            _diff(f"{path}[{i}]", xi, yi, out)
        return
    out.append(f"{path}: {_fmt(x)} vs {_fmt(y)}")


def _fmt(k: Key) -> str:
    if _is_tensor_key(k):
        return f"tensor{tuple(k[1])} {k[2]} {k[3]}"
    if type(k) is tuple and len(k) >= 3 and k[1] == _NONE_RUN:
        return f"{k[0].__name__} of {k[2]} None"
    if type(k) is tuple and len(k) >= 3 and k[1] == _SCALAR_RUN:
        return f"{k[0].__name__} of {len(k[3])} {k[2].__name__}"
    if type(k) is tuple and len(k) == 4 and k[1] == _SAME_RUN:
        return f"{k[0].__name__} of {k[2]} x {_fmt(k[3])}"
    if type(k) is tuple and len(k) == 3 and k[0] == _OBJECT:
        return f"<{k[1].__name__} object id={k[2]:#x}>"
    if type(k) is tuple and len(k) == 2 and isinstance(k[0], type) and k[0] in _SCALARS:
        return repr(k[1])
    if _is_container_key(k):
        return f"{k[0].__name__} of {len(k[1])}"
    return repr(k)


def summarize(key: CallKey, limit: int = 240) -> str:
    """One short line for logs and stats: tensor shapes and host values by argument name."""
    args, kw = key
    parts = [f"args[{i}]={_brief(k)}" for i, k in enumerate(args)]
    parts += [f"{name}={_brief(k)}" for name, k in kw if k is not None]
    text = " ".join(parts)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _brief(k: Key) -> str:
    if _is_tensor_key(k):
        dtype = str(k[2]).removeprefix("torch.")
        return f"{tuple(k[1])}{dtype}".replace(" ", "")
    return _fmt(k).replace(" ", "")
