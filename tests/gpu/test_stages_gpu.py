"""On CUDA: the device pixel rule equals the host one, and overlapped stages (three streams and a
prefetch thread) give the serial engine's bytes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from jobs.worker.dispatcher import CaptureDispatcher
from jobs.worker.pipeline import Pipeline
from jobs.worker.pixels import to_uint8, to_uint8_torch
from jobs.plan import Batch
from jobs.worker.scheduler import StageScheduler
from padding import get_padder
from tests.gpu.test_job_gpu import encoder_overrides
from tests.helpers import tiny_pipeline
from tests.test_stages import SIG, items

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_device_pixel_rule_equals_the_host_rule(dtype):
    g = torch.Generator().manual_seed(1)
    x = (torch.rand(4, 3, 64, 48, generator=g) * 1.2 - 0.1).to(dtype)
    x[1, 0, 0, :4] = torch.tensor([float("nan"), float("inf"), float("-inf"), 254.5 / 255])
    u8, finite = to_uint8_torch(x.cuda())
    host = x.permute(0, 2, 3, 1).float().numpy()
    for i in range(4):
        assert np.array_equal(u8[i].cpu().numpy(), to_uint8(host[i]))
    assert finite.cpu().tolist() == [True, False, True, True]


def test_overlapped_stages_equal_the_serial_engine_on_cuda():
    cfg, fam, pipe = tiny_pipeline("sana_tiny", *encoder_overrides())
    pipe = pipe.to("cuda")
    padder = get_padder("sana", buckets=cfg.text_buckets, native_length=cfg.model.max_sequence_length)
    engine = Pipeline(cfg, fam, pipe, padder, None, torch.device("cuda"))
    batches = [Batch(SIG, items(4, 4 * i), 4) for i in range(5)] + [Batch(SIG, items(1, 20), 2)]
    serial = [engine.generate(b) for b in batches]
    overlapped = list(StageScheduler(engine, CaptureDispatcher(None, engine.cfg.bcg), overlap=True).run(batches, lambda: False))
    assert [r.items for r in overlapped] == [b.items for b in batches]
    for a, b in zip(serial, overlapped):
        assert all(np.array_equal(x, y) for x, y in zip(a.images, b.images))
        assert a.finite == b.finite
