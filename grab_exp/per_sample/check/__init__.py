"""The checks every path runs: what a path assumes of the model and the loss, they can break
without an error.

* every call, :mod:`.mean`: the rows' mean against ``param.grad``, which one plain
  ``loss.backward()`` wrote (a missed or doubled term: a weight used outside its layer, a tie, a
  gradient hook, a stale buffer); and :func:`~.loss.loss_gap`, the loss split in two at a point
  that moves from call to call (weighting between full checks);
* a full check (:mod:`.examples`, :mod:`.loss`): the identity, in the spirit of Freivalds': for
  random weights ``c (B,)``, ``sum_i c_i g_i`` of the rows must equal autograd's gradient of
  ``sum_i c_i loss_i`` (rows given to the wrong examples, missing or doubled terms; one extra
  backward); the hook path takes it at its rule layers' outputs (a ``(B, ...)`` comparison) and
  the other layers' parameters. The loss must be the mean of the examples' own; two examples run
  alone must get the outputs they got in the batch (mixing).

:class:`~.schedule.Check` runs a full check on calls 1, 2, 4, ... up to ``every``, then every
``every``-th, on every new structure and on the first batch of 2 or more (``every=0``: nothing;
a captured step replays without it). Nothing of a check stays (:func:`~.state.kept_state`).
"""
