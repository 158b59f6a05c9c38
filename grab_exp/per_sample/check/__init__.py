"""The checks every path runs: a path assumes things about the model and the loss that they can
break without an error, and the checks catch them.

* every call (:mod:`.mean`): the rows' mean against ``param.grad``, which one plain
  ``loss.backward()`` wrote; it catches a missed or doubled term of the gradient (a weight used
  outside its layer, a tie made after construction, a gradient hook, a stale buffer layout), and
  a split of the loss in two parts at a point that moves from call to call
  (:func:`~.loss.loss_gap`) catches weighting between full checks;
* a full check (:mod:`.examples`, :mod:`.loss`), when :class:`~.schedule.Check` says: the
  identity, in the spirit of Freivalds' check: for random weights ``c (B,)``, the rows' weighted
  sum ``sum_i c_i g_i`` must equal autograd's gradient of ``sum_i c_i loss_i`` (``loss_i``:
  example ``i``'s loss read from the batch's own output), which catches rows attributed to the
  wrong examples, missing terms and double counting with one extra backward and no float64
  copy; the loss, the mean of the examples' own losses (class weights and ``ignore_index``
  normalize by the batch, ``reduction="sum"`` adds up); mixing, two examples run alone get the
  outputs they got in the batch.

The hook path takes the identity at its rule layers' outputs (``c_i`` times example ``i``'s row of
the output gradient: a ``(B, ...)`` comparison, no weight gradient formed; the rule's closed form,
tested against a per-example loop, does the rest) and at the other layers' parameters.

The schedule: the first call, calls 2, 4, 8, ... up to ``every``, then every ``every``-th call,
every new structure (the batch's :func:`~.layout.input_shapes`, a layer's call count, the
trainable set, the modules' modes), and the first batch of at least 2 examples. ``every=0`` turns
all of it off; a captured step (``trainer.cuda_graph``) replays without it. Nothing of a check
stays (:func:`~.state.kept_state`).
"""
