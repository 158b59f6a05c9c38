"""Training one job, top to bottom in :mod:`~grab_exp.runner.training.job`: build, step, epochs."""
