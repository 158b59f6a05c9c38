"""The runner builds the pipeline its ordering can use: ``pipeline.method=auto`` keeps LeNet's
Linear layers as factors only for an ordering that reads factors (not recursive balance, a
sketch or the data-parallel orderings, which materialize them)."""

from __future__ import annotations

import pytest
import torch
from hydra.utils import instantiate

from grab_exp.runner.training.build import build_job
from grab_exp.runner.training.strategy import Strategy


@pytest.mark.parametrize(
    ("overrides", "method"),
    [
        (["balance=mean"], "factored"),
        (["balance=rr"], "factored"),  # functional RR: the GraB rows' pipeline
        (["balance=recursive"], "factored"),  # it writes its centered rows from the factors
        (["balance=recursive_pair"], "factored"),
        (["balance=mean", "balance.projection_dim=64"], "hooks"),
        (["balance=mean", "pipeline.method=factored"], "factored"),
        (["balance=mean", "pipeline.method=loop"], "loop"),
    ],
)
def test_auto_factors_only_for_an_ordering_that_reads_them(compose, overrides, method):
    cfg = compose(["experiment=smoke", *overrides])
    data = instantiate(cfg.dataset)
    job = build_job(cfg, data, Strategy(torch.device("cpu")))
    assert job.parts.pipeline.method == method


def test_data_parallel_overrides_every_method_of_the_single_process_strategy():
    """``Strategy`` is the single-process strategy itself: a data-parallel one that left it a
    method would act alone there (no gradient averaging, no gathered state) without a word."""
    from grab_exp.runner.training.data_parallel import DataParallel

    methods = {n for n, v in vars(Strategy).items() if callable(v) and not n.startswith("_")}
    assert methods and methods - set(vars(DataParallel)) == set()
