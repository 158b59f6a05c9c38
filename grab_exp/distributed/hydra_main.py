"""``[torchrun ...] python -m grab_exp.distributed.hydra_main +distributed=true balance=cd_grab``.

The Hydra runner's data-parallel job on its own, for use before ``python -m grab_exp``
dispatches ``distributed=true`` itself (the same config tree, ``conf/``).
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from grab_exp.runner.resolvers import register_resolvers

register_resolvers()


@hydra.main(config_path="../../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    """Run one data-parallel job; returns the final test accuracy."""
    from grab_exp.distributed.hydra_job import run_distributed_job

    return run_distributed_job(cfg).get("test/acc")


if __name__ == "__main__":
    main()
