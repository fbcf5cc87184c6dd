"""GLM-Image: every prompt at its native glyph length; equal lengths share a graph, nothing is padded.

What diffusers 0.42.1's `GlmImagePipeline` hands its DiT as text (pipeline_glm_image.py,
transformer_glm_image.py; tests/test_family_glm_image.py pins it):

- Only the prompt's *quoted* spans ('...', "...", “...”, 「...」) are encoded, by a T5 (ByT5)
  glyph encoder; a prompt without quotes encodes "" (one token). The real tokens of all spans are
  concatenated: that concatenation's length is the prompt's glyph length. The prompt as a whole
  reaches the model through the autoregressive prior's image tokens, not through this text.
- A batch of prompts with different glyph lengths is *left-padded with zero rows* to the longest,
  and `GlmImageTransformer2DModel` takes no text mask (the pipeline passes none): its glyph
  projector turns a zero row into a non-zero vector that joint attention reads. Padding changes
  the image, so batching prompts of different glyph lengths would too.

So the bucket is the exact glyph length (`bucket_for(n) == n`, as for Z-Image): a batch only
holds prompts of one length, none is padded, and equal lengths share a graph. Most prompts quote
nothing and share the length-1 bucket. `pad()` may re-cut storage only where the mask is 0 (the
unconditional side, which the family never hands the pipeline: GLM-Image's unconditional branch
is the pipeline's own empty glyph text with the prior tokens dropped); cutting real rows is refused.
"""

from __future__ import annotations

from padding.registry import register_padder
from padding.z_image import ZImagePadder


@register_padder("glm_image")
class GlmImagePadder(ZImagePadder):
    name = "glm_image"
