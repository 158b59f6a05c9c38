"""A seeded differential fuzzer of ``make_per_sample`` (issue 49, item 11).

Each case (:mod:`fuzz.case`) is drawn from one seed: a model composed of generated layers
(:mod:`fuzz.models`, :mod:`fuzz.blocks`), its loss (:mod:`fuzz.losses`), its batches
(:mod:`fuzz.inputs`), the changes between calls (:mod:`fuzz.schedule`), the method and the
precision (``precision:autocast``: a float32 model, every call under CPU bfloat16 autocast); the
oracle (:mod:`fuzz.oracle`) runs ONE ``psg`` over the batches against a float64 per-example loop
and a plain ``loss.backward()`` (:mod:`fuzz.reference`; under autocast, those of the same
precision and a float32 per-example loop without it), and the buffers and frozen parameters after
each call against the plain step's, and names the outcome.
:mod:`fuzz.regressions` holds the minimal cases of the classes it found; ``python -m fuzz.run``
(with ``tests/per_sample`` on ``PYTHONPATH``) runs a range of seeds and prints the table.
"""
