"""LTX-2: every prompt at 1024 text positions, passed through; padding to any other length refused.

What diffusers 0.42.1's `LTX2Pipeline` does with the text (pipeline_ltx2.py, connectors.py,
transformer_ltx2.py; tests/test_family_ltx2.py pins each fact against the installed diffusers):

- `_get_gemma_prompt_embeds` tokenizes to max_sequence_length (1024), *left*-padded, runs Gemma 3
  and stacks every layer's hidden states: the embeddings are [B, 1024, hidden x (layers + 1)].
- `LTX2TextConnectors` (run inside the pipeline call, before the denoising loop) normalizes over
  the real tokens, then each connector moves the real tokens to the front and fills every pad
  position with one of its learned registers (`num_learnable_registers`, 128 in the released
  checkpoints), *unmasks all 1024 positions*, and runs self-attention with 1-D rotary positions
  over them. The mask it hands the transformer is all ones.
- `LTX2VideoTransformer3DModel` therefore cross-attends to every register: the number of pad
  positions is the number of registers the video (and the audio) attend to. Cutting or growing the
  sequence changes the output, and the connectors refuse lengths that are not a multiple of the
  register count anyway. (A connector without registers keeps the mask, but the real tokens sit at
  the right end of a left-padded sequence, so their rotary positions would move with the length.)

So the padder passes the 1024 positions through and refuses any other length, as for Flux and Wan
(padding/passthrough.py). Every prompt has the same length, so all share one bucket: nothing is lost.
"""

from __future__ import annotations

from padding.passthrough import FixedLengthPadder
from padding.registry import register_padder


@register_padder("ltx2")
class LTX2Padder(FixedLengthPadder):
    name = "ltx2"
    reason = ("LTX2Pipeline's text connectors replace every pad position by a learned register and unmask all "
              "max_sequence_length positions, so the transformer attends to the padding and changing its length "
              "changes the video and its audio")
