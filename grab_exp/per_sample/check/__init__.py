"""The checks every path runs of what a path assumes of the model and the loss.

* every call, :mod:`.mean`: the rows' mean against ``param.grad``, which one plain
  ``loss.backward()`` wrote (a tie, a gradient hook, a weight used outside its layer); and
  :func:`~.loss.loss_gap`, the loss split in two at a point that moves from call to call;
* a full check, when :class:`~.schedule.Check` says: the identity (:mod:`.examples`, after
  Freivalds: for random weights ``c (B,)``, ``sum_i c_i g_i`` of the rows must be autograd's
  gradient of ``sum_i c_i loss_i``; the hook path takes it at its rule layers' outputs and the
  other layers' parameters), mixing (examples run alone get their outputs in the batch) and the
  loss contract (:mod:`.loss`). Nothing of a check stays (:func:`~.state.kept_state`).
"""
