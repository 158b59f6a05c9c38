"""``hydra/launcher=joblib_local``: the runner's
:class:`~grab_exp.runner.launch.joblib_launcher.JoblibLocalLauncher` under
Hydra's plugin package (only where the joblib plugin is installed: the ``launchers`` extra).
"""

import importlib.util

if importlib.util.find_spec("hydra_plugins.hydra_joblib_launcher") is not None:
    from grab_exp.runner.launch.joblib_launcher import JoblibLocalLauncher

    class GrabJoblibLauncher(JoblibLocalLauncher):
        """See :class:`grab_exp.runner.launch.joblib_launcher.JoblibLocalLauncher`."""
