"""Signatures: what splits a key, what does not, the long-list fast paths, rebuild, the miss text."""

import torch

from bcg.signature import describe_difference, flatten, rebuild, signature, summarize


def sig(*args, **kwargs):
    return signature(args, kwargs)


def test_tensor_keys_by_shape_dtype_device_not_values():
    a, b = torch.zeros(2, 3), torch.ones(2, 3)
    assert sig(a) == sig(b)
    assert sig(a) != sig(torch.zeros(3, 2))
    assert sig(a) != sig(torch.zeros(2, 3, dtype=torch.float64))
    assert sig(a) != sig(torch.zeros(2, 3, device="meta"))


def test_tensor_keys_hold_strides():
    """A transposed view and a contiguous tensor of one shape are two keys: kernels pick their path by
    layout (cuBLAS on LTX-2's transposed latents rounds apart from a contiguous copy)."""
    x = torch.zeros(1, 8, 192)
    view = x.transpose(1, 2)  # shape (1, 192, 8), strides (1536, 1, 192)
    assert sig(view) != sig(view.contiguous())
    assert sig(view) == sig(torch.ones(1, 8, 192).transpose(1, 2))
    lines = describe_difference(sig(h=view), sig(h=view.contiguous()))
    assert lines == ["h: strides (1536, 1, 192) vs (1536, 8, 1)"]


def test_scalars_keep_their_type_and_value():
    assert sig(1) != sig(1.0) != sig(True)
    assert sig(1) != sig(True)
    assert sig(guidance=4.5) != sig(guidance=3.5)
    assert sig(return_dict=False) == sig(return_dict=False)
    assert sig(None) != sig("None")


def test_kwargs_and_dicts_are_order_free_and_values_are_values():
    assert sig(a=1, b=2) == sig(b=2, a=1)
    assert sig({"x": 1, "y": 2}) == sig({"y": 2, "x": 1})
    assert sig(torch.device("cpu")) == sig(torch.device("cpu"))
    assert sig(torch.float16) != sig(torch.bfloat16)
    assert sig([1, 2]) != sig((1, 2))


def test_other_objects_key_by_identity():
    class Thing:
        pass

    t1, t2 = Thing(), Thing()
    assert sig(t1) == sig(t1)
    assert sig(t1) != sig(t2)


def test_long_none_list_takes_the_compact_fast_path():
    key = sig(extra=[None] * 72_000)
    # The slow walk would give a 72,000-item tuple; the fast path keys the run by its length.
    assert key == ((), (("extra", (list, "<None*>", 72_000)),))
    assert sig(extra=[None] * 72_000) != sig(extra=[None] * 71_999)
    assert sig(extra=[None] * 72_000) != sig(extra=tuple([None] * 72_000))


def test_nested_none_lists_take_the_fast_path_and_stay_exact():
    nested = [[None] * 100 for _ in range(720)]  # 72,000 Nones, distinct inner lists
    key = sig(nested)
    assert len(repr(key)) < 200
    assert key == sig([[None] * 100] * 720)
    broken = [[None] * 100 for _ in range(720)]
    broken[300][7] = 0
    assert sig(broken) != key
    assert len(flatten((broken,), {})[1]) == 0


def test_a_single_odd_item_leaves_the_fast_path_with_the_right_key():
    items = [None] * 1000
    items[500] = 3
    odd = sig(items)
    assert odd != sig([None] * 1000)
    assert odd[0][0][1][500] == (int, 3)


def test_scalar_runs_keep_types_and_values():
    ints = list(range(100))
    assert sig(ints) == sig(list(range(100)))
    assert sig(ints) != sig(list(range(1, 101)))
    mixed = list(range(100))
    mixed[1] = True  # == 1, but a bool
    assert sig(mixed) != sig(ints)


def test_long_lists_of_tensors_collect_every_leaf():
    ts = [torch.zeros(i + 1) for i in range(20)]
    key, leaves = flatten((ts,), {})
    assert [t.shape[0] for t in leaves] == list(range(1, 21))
    assert key != signature(([torch.zeros(1)] * 20,), {})


def test_flatten_and_rebuild_walk_the_same_order():
    x, y, z = torch.zeros(1), torch.zeros(2), torch.zeros(3)
    args = (x, [1, {"b": y, "a": None}])
    kwargs = {"zeta": z, "alpha": (x, "s")}
    key, leaves = flatten(args, kwargs)
    assert [t.shape[0] for t in leaves] == [1, 2, 1, 3]  # args, then kwargs sorted by name
    new = [torch.full((t.shape[0],), float(i)) for i, t in enumerate(leaves)]
    a2, k2 = rebuild(args, kwargs, new)
    assert a2[1][1]["b"] is new[1] and k2["alpha"][0] is new[2] and k2["zeta"] is new[3]
    assert list(k2) == ["zeta", "alpha"]  # the caller's keyword order survives
    assert signature(a2, k2) == key


def test_describe_difference_names_fields():
    a = sig(hidden_states=torch.zeros(2, 4), encoder_hidden_states=torch.zeros(2, 64, 384),
            return_dict=False)
    b = sig(hidden_states=torch.zeros(2, 4), encoder_hidden_states=torch.zeros(2, 128, 384),
            return_dict=True, guidance=None)
    lines = describe_difference(a, b)
    assert "encoder_hidden_states: shape (2, 64, 384) vs (2, 128, 384)" in lines
    assert "return_dict: False vs True" in lines
    assert "guidance: absent vs present" in lines
    assert len(lines) == 3
    assert describe_difference(a, a) == []


def test_describe_difference_dtype_and_long_lists():
    a = sig(torch.zeros(2), extra=[None] * 50)
    b = sig(torch.zeros(2, dtype=torch.bfloat16), extra=[None] * 60)
    lines = describe_difference(a, b)
    assert lines == ["args[0]: dtype torch.float32 vs torch.bfloat16",
                     "extra: list of 50 None vs list of 60 None"]


def test_summarize_is_short_and_names_tensors():
    s = summarize(sig(hidden_states=torch.zeros(2, 32, 16, 16, dtype=torch.bfloat16),
                      extra=[None] * 72_000))
    assert "hidden_states=(2,32,16,16)bfloat16" in s
    assert len(s) < 240
