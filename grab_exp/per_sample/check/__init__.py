"""The checks every path runs of what a path assumes of the model and the loss (the long form:
docs/which-models-work.md): every call :mod:`.mean` and :class:`~.loss.OutputSplit`; a full check,
when :class:`~.schedule.Check` says, :mod:`.examples` (the identity, mixing), :mod:`.loss` and
:mod:`.resampled`. Nothing of a check stays (:func:`~.state.kept_state`)."""
