"""The families room: one file per model family (load, plan text lengths, encode, denoise, decode),
registered by name in registry.py; base.py is what every family provides.

May import: jobs.config, jobs.errors, padding/ (the text embeddings type), diffusers and transformers;
never bcg/ (families know no graphs) and never the worker, the planner or output. torch, diffusers
and transformers only inside the methods that build or run a model: the planner imports every
family and runs no tensor op (tests/test_plan_imports.py).
"""
