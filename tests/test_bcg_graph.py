"""The engine's own segment logic (capture, breaks, bridges, replay) on the CPU op tape."""

import threading

import pytest
import torch

from bcg import eager_on_graph
from bcg.graph import BreakStep, active_capture, capture_forward
from bcg.tape import HostReadDuringCapture, TapeRecorder

calls: list[str] = []


@eager_on_graph
def double(y):
    calls.append("break")
    return y * 2


def forward(x):
    y = x + 1          # segment 0: 10 -> 11
    y = double(y)      # break:     11 -> 22
    return y + 5       # segment 1: 22 -> 27


def test_segment_order_by_arithmetic():
    calls.clear()
    x = torch.tensor([10.0])
    out, graph = capture_forward(lambda: forward(x), TapeRecorder())
    assert out.item() == 27.0
    assert graph.segments == 2 and len(graph.breaks) == 1
    assert [type(s).__name__ for s in graph.steps] == ["TapeSegment", "BreakStep", "TapeSegment"]
    assert calls == ["break"]  # ran once, eagerly, during capture
    x.copy_(torch.tensor([20.0]))  # a live value copied into the static input
    graph.replay()
    assert out.item() == 47.0  # 20 -> 21 -> 42 -> 47: only this order gives 47
    assert calls == ["break", "break"]


def test_next_segment_reads_the_bridge_buffer():
    x = torch.tensor([10.0])
    out, graph = capture_forward(lambda: forward(x), TapeRecorder())
    brk = graph.breaks[0]
    bridge = brk.bridges[0]
    bridge.fill_(100.0)        # a wrong bridge ...
    graph.steps[2].replay()    # ... is what segment 1 reads
    assert out.item() == 105.0
    graph.replay()             # a full replay refreshes the bridge from the eager result
    assert out.item() == 27.0 and brk.bridges[0] is bridge and bridge.item() == 22.0


def test_break_with_tuple_output_bridges_every_tensor():
    @eager_on_graph
    def split(y):
        return y * 2, y * 3, "label"

    x = torch.tensor([1.0])

    def fwd():
        a, b, label = split(x + 1)
        assert label == "label"
        return a + b

    out, graph = capture_forward(fwd, TapeRecorder())
    assert out.item() == 10.0 and len(graph.breaks[0].bridges) == 2
    x.fill_(2.0)
    graph.replay()
    assert out.item() == 15.0


def test_eager_on_graph_passes_straight_through_outside_capture():
    calls.clear()
    assert active_capture() is None
    assert double(torch.tensor([3.0])).item() == 6.0
    assert calls == ["break"]
    assert double.__name__ == "double" and double.__bcg_break__


def test_nested_capture_raises_and_state_is_cleared():
    def inner():
        capture_forward(lambda: torch.zeros(1) + 1, TapeRecorder())

    with pytest.raises(RuntimeError, match="do not nest"):
        capture_forward(inner, TapeRecorder())
    assert active_capture() is None


def test_capture_state_cleared_after_a_failing_forward():
    def bad():
        y = torch.ones(2) + 1
        return y.sum().item()  # a host read: no graph can hold it

    with pytest.raises(HostReadDuringCapture, match="_local_scalar_dense"):
        capture_forward(bad, TapeRecorder())
    assert active_capture() is None
    assert torch.ones(1).add(1).item() == 2.0  # no tape mode left on the stack


def test_capture_state_is_thread_local():
    seen = []

    def fwd():
        t = threading.Thread(target=lambda: seen.append(active_capture()))
        t.start()
        t.join()
        seen.append(active_capture())
        return torch.zeros(1) + 1

    capture_forward(fwd, TapeRecorder())
    assert seen[0] is None and seen[1] is not None


def test_break_inside_a_break_runs_inline():
    @eager_on_graph
    def outer(y):
        return double(y) + 1

    calls.clear()
    x = torch.tensor([1.0])
    out, graph = capture_forward(lambda: outer(x + 1) * 1, TapeRecorder())
    assert out.item() == 5.0 and len(graph.breaks) == 1
    assert isinstance(graph.steps[1], BreakStep) and graph.steps[1].fn.__name__ == "outer"


def test_tape_replays_inplace_and_view_ops():
    x = torch.arange(6.0)

    def fwd():
        y = x.view(2, 3) * 1.0
        y.add_(1)                 # in place on a recorded output
        z = y.t()                 # a view, not re-run
        return torch.cat([z.reshape(-1), y.sum(0)])

    out, graph = capture_forward(fwd, TapeRecorder())
    expected = lambda: torch.cat([(x.view(2, 3) + 1).t().reshape(-1), (x.view(2, 3) + 1).sum(0)])
    assert torch.equal(out, expected())
    x.copy_(torch.arange(6.0) * 10)
    graph.replay()
    assert torch.equal(out, expected())


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode])
def test_tape_reruns_may_alias_ops_that_made_new_memory(grad_mode):
    """Under inference_mode the tape sees composite ops whole: reshape of a transposed tensor,
    .to() another dtype and contiguous() return new memory although their schemas may alias. They
    must be re-run on replay like functional ops (a view of the input is not)."""
    with grad_mode():
        x = torch.randn(2, 6, 4).transpose(1, 2)  # [2, 4, 6], no view can flatten it

        def f():
            return x.reshape(2, -1) * 1, x.to(torch.float64), x.contiguous(), x[:, :1]

        outs, graph = capture_forward(f, TapeRecorder())
        x.copy_(torch.randn(2, 6, 4).transpose(1, 2))
        graph.replay()
        want = (x.reshape(2, -1), x.to(torch.float64), x.contiguous(), x[:, :1])
        assert all(torch.equal(o, w) for o, w in zip(outs, want))
