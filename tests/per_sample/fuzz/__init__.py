"""A seeded differential fuzzer of ``make_per_sample`` (issue 49, item 11).

Each case (:mod:`fuzz.case`) is drawn from one seed: a model composed of generated layers
(:mod:`fuzz.models`, :mod:`fuzz.blocks`), its loss (:mod:`fuzz.losses`), its batches
(:mod:`fuzz.inputs`), the changes between calls (:mod:`fuzz.schedule`) and the method; the
oracle (:mod:`fuzz.oracle`) runs ONE ``psg`` over the batches against a float64 per-example loop
and a plain ``loss.backward()`` (:mod:`fuzz.reference`) and names the outcome.
:mod:`fuzz.regressions` holds the minimal cases of the classes it found; ``python -m fuzz.run``
(with ``tests/per_sample`` on ``PYTHONPATH``) runs a range of seeds and prints the table.
"""
