"""Prompt adherence of the demo model: held-out prompts with known labels, generation, scoring.

The prompts are the bundled ones (jobs/demo/prompt_set.py: held-out phrasings, with the labels
each states). `generate_eager` runs SanaPipeline's own call
on them (no job, no padder, no graph runner), as the job's defaults would: negative prompt "",
guidance, steps, size, one CPU generator per seed. `score` reads each image back with the fixed
pixel rule (jobs/demo/classify.py) and counts the attributes each prompt states.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np

from jobs.demo.classify import classify
from jobs.demo.scenes import Labels

ATTRIBUTES = ("color", "background", "shape")


def generate_eager(pipe, prompts: Sequence[str], seeds: Sequence[int], *, steps: int, guidance_scale: float,
                   height: int, width: int, batch: int = 8, max_sequence_length: int = 300,
                   negative_prompt: str = "") -> List[np.ndarray]:
    """uint8 [H, W, 3] images from SanaPipeline.__call__, `batch` prompts a call."""
    import torch

    out = []
    for start in range(0, len(prompts), batch):
        chunk = list(prompts[start:start + batch])
        gens = [torch.Generator("cpu").manual_seed(int(s)) for s in seeds[start:start + batch]]
        images = pipe(prompt=chunk, negative_prompt=negative_prompt, guidance_scale=guidance_scale,
                      num_inference_steps=steps, height=height, width=width, generator=gens,
                      max_sequence_length=max_sequence_length, complex_human_instruction=None,
                      use_resolution_binning=False, output_type="np", return_dict=False)[0]
        out += [(np.clip(im, 0, 1) * 255).round().astype(np.uint8) for im in images]
    return out


def score(images: Sequence[np.ndarray], labels: Sequence[Labels]) -> Dict:
    """Per-attribute accuracy over the prompts that state the attribute, and the readings."""
    correct = {a: 0 for a in ATTRIBUTES}
    stated = {a: 0 for a in ATTRIBUTES}
    readings = []
    for image, lab in zip(images, labels):
        r = classify(image)
        readings.append(r.as_dict())
        for a in ATTRIBUTES:
            want = getattr(lab, a)
            if want is not None:
                stated[a] += 1
                correct[a] += int(getattr(r, a) == want)
    acc = {a: (correct[a] / stated[a] if stated[a] else None) for a in ATTRIBUTES}
    all_three = sum(all(getattr(lab, a) in (None, r[a]) for a in ATTRIBUTES) for lab, r in zip(labels, readings))
    return {"n": len(readings), "accuracy": acc, "correct": correct, "stated": stated,
            "all_three": all_three / max(1, len(readings)), "readings": readings}
