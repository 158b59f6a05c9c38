"""Hydra plugins of grab_exp (Hydra only instantiates plugins from the ``hydra_plugins``
package): thin names for the classes in :mod:`grab_exp.runner.launch.sweeper` and
:mod:`grab_exp.runner.launch.joblib_launcher`."""
