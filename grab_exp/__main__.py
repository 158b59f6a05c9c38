"""``python -m grab_exp [overrides]``: Hydra-composed training (``-m`` for a multirun)."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from grab_exp.runner.resolvers import register_resolvers

register_resolvers()


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    """Train one job; returns the final test accuracy (for sweepers)."""
    from grab_exp.runner.run import run_job  # after Hydra set up logging

    final = run_job(cfg)
    return final.get("test/acc")


if __name__ == "__main__":
    main()
