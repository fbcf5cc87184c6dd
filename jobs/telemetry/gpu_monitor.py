"""GPU busy over the generate stage: NVML's utilization counter, sampled on a thread.

NVML's `utilization.gpu` is the fraction of its last sample period during which at least one
kernel ran: the "GPU busy" of ANCHORS.md. Sampling costs the job nothing on the GPU; without
NVML (no nvidia-ml-py, or a CPU job) the monitor is a no-op and reports None.
"""

from __future__ import annotations

import logging
import threading
from typing import List, Optional

import torch

log = logging.getLogger(__name__)


class GpuMonitor:
    def __init__(self, device: torch.device, period_s: float = 0.2):
        self.period_s = period_s
        self.samples: List[int] = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._handle = _nvml_handle(device) if device.type == "cuda" else None

    def __enter__(self) -> "GpuMonitor":
        if self._handle is not None:
            self._thread = threading.Thread(target=self._sample, name="bcgen-gpu-monitor", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _sample(self) -> None:
        import pynvml

        while not self._stop.wait(self.period_s):
            self.samples.append(pynvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)

    def busy(self) -> Optional[float]:
        """Mean busy fraction over the samples, or None when nothing was sampled."""
        return round(sum(self.samples) / (100.0 * len(self.samples)), 4) if self.samples else None


def _nvml_handle(device: torch.device):
    try:
        import pynvml

        pynvml.nvmlInit()
        index = device.index if device.index is not None else torch.cuda.current_device()
        uuid = str(torch.cuda.get_device_properties(index).uuid)  # robust to CUDA_VISIBLE_DEVICES
        return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    except Exception as e:  # noqa: BLE001 - optional telemetry: the job runs without it
        log.info("GPU busy is not sampled (%s: %s)", type(e).__name__, e)
        return None
