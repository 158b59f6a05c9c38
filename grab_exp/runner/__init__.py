"""The experiment runner behind ``python -m grab_exp`` (Hydra-composed training).

Its sub-packages import only downwards: :mod:`~grab_exp.runner.config` (what a config may say),
:mod:`~grab_exp.runner.rundir` (where a job writes), :mod:`~grab_exp.runner.training` (one job,
its path in :mod:`~grab_exp.runner.training.job`), :mod:`~grab_exp.runner.launch` (jobs from the
command line).
"""
