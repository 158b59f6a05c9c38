"""A user's ``--config-dir`` before our configs in ``python -m grab_exp``'s search path: see
:func:`grab_exp.runner.launch.search_path.user_dirs_first`."""

import sys

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

from grab_exp.runner.launch.search_path import user_dirs_first


class UserConfigFirst(SearchPathPlugin):
    """The user's file of a name wins over ours (Hydra's search path order)."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        user_dirs_first(search_path, sys.argv)
