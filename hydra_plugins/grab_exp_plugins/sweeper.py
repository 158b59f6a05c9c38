"""``hydra/sweeper=grab``: :class:`grab_exp.runner.launch.sweeper.Sweeper` under Hydra's plugin
package."""

from grab_exp.runner.launch.sweeper import Sweeper


class GrabSweeper(Sweeper):
    """See :class:`grab_exp.runner.launch.sweeper.Sweeper`."""
