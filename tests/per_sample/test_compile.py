"""``trainer.compile``: compiled steps match eager ones; settings, the runner and checkpoints.

Tolerance of compiled vs eager (float32): losses ``rtol=1e-5``, parameters ``atol=1e-6,
rtol=1e-5``. Inductor fuses kernels and may reorder float32 reductions (a matmul's or a sum's
order of additions), so results agree to a few ulps per operation, not bit for bit; after a few
steps we measured differences below 3e-7 (relative, losses) and 7e-8 (absolute, parameters), so
the bounds leave a 10x margin. A wrong gradient moves parameters by about ``lr * |g|`` per step,
1e-5 and more here, which the test also requires training to do (so it cannot pass vacuously).
"""

from __future__ import annotations

import json
from contextlib import AbstractContextManager, nullcontext

import pytest
import torch
import torch._dynamo
from hydra.errors import ConfigCompositionException
from support.grab_run import (
    cli_env,
    compose_config,
    compose_job,
    run_cli,
    run_in_process,
    train_epochs,
)
from torch.nn import functional as F

from grab_exp.models import LeNet
from grab_exp.per_sample import FuncPerSample, PerSamplePipeline, make_per_sample
from grab_exp.per_sample.compiled import COMPILE_MODES
from grab_exp.runner.config.check import ConfigError, validate_config
from grab_exp.runner.rundir.checkpoint import CHECKPOINT_NAME
from grab_exp.runner.rundir.resolvers import settings_hash

# a small MLP keeps compilation short; 72 = 4 * 16 + 8: the short last batch is a second graph
SMALL_MODEL = ("model=mlp", "model.hidden=[16]", "batch_size=16", "dataset.num_train=72")
CASES = {  # pipeline, ordering and optimizer
    "classic": ("pipeline=classic", "balance=rr", "optimizer=sgd"),
    "functional": ("pipeline=functional", "balance=mean", "optimizer=sgd"),
    "functional-vr_momentum": ("pipeline=functional", "balance=pair", "optimizer=vr_momentum"),
}
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _compiled_graphs() -> tuple[int, int]:
    """``(graphs Dynamo compiled, graph breaks)`` since the last reset."""
    counters = torch._dynamo.utils.counters
    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


def _no_recompilation() -> AbstractContextManager:
    """From torch 2.6 on, any compilation in the block raises (earlier: nothing is checked)."""
    if hasattr(torch.compiler, "set_stance"):
        return torch.compiler.set_stance("fail_on_recompile")
    return nullcontext()


def _train(overrides: list[str], device: str, epochs: int = 2):
    """Every step's loss ``(steps,)``, the final parameters and order, the graphs compiled in
    the first epoch and the number of batch shapes; later epochs compile nothing."""
    torch._dynamo.reset()  # a fresh cache: earlier tests' models never count against its limit
    torch._dynamo.utils.counters.clear()
    job = compose_job(overrides, device)
    initial = [p.detach().clone() for p in job.parts.model.parameters()]
    first = train_epochs(job, 1)
    graphs = _compiled_graphs()
    with _no_recompilation():  # every batch shape's graph is reused as it is
        later = train_epochs(job, epochs - 1, start=1)
    assert _compiled_graphs() == graphs
    final = [p.detach().clone() for p in job.parts.model.parameters()]
    n = len(job.data.train_x)
    shapes = len({min(job.batch_size, n - s) for s in range(0, n, job.batch_size)})
    order = job.parts.ordering.order.clone()
    return torch.cat([first, later]), initial, final, order, (graphs, shapes)


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_compiled_training_matches_eager(case, device):
    overrides = [*SMALL_MODEL, *CASES[case]]
    eager_losses, initial, eager_params, eager_order, eager_graphs = _train(overrides, device)
    losses, _, params, order, ((graphs, breaks), shapes) = _train(
        [*overrides, "trainer.compile=true"], device
    )
    assert eager_graphs[0] == (0, 0)
    assert shapes == 2  # batches of 16 and a last one of 8
    assert (graphs, breaks) == (shapes, 0)  # one graph per batch shape, no graph break
    torch.testing.assert_close(losses, eager_losses, rtol=1e-5, atol=0)
    for p, q in zip(params, eager_params, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    moved = max((p - p0).abs().max().item() for p, p0 in zip(params, initial, strict=True))
    assert moved > 1e-4  # training really changed the parameters (far beyond the tolerance)
    # the per-sample gradients agree so closely that GraB's signs, hence the orders, are equal
    assert torch.equal(order, eager_order)


def test_compile_must_be_a_bool():
    with pytest.raises(ConfigCompositionException, match=r"trainer\.compile"):
        compose_config(["experiment=smoke", "trainer.compile=maybe"])  # the typed schema


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.compile_mode=fast"], "trainer.compile_mode: got 'fast'; allowed: default, "),
        (
            ["trainer.compile=true", "pipeline.method=hooks"],
            "pipeline.method: got 'hooks'; allowed: auto, func with trainer.compile=true",
        ),
        (
            ["trainer.compile=true", "pipeline.method=loop"],
            "pipeline.method: got 'loop'; allowed: auto, func with trainer.compile=true",
        ),
    ],
)
def test_bad_compile_settings_fail_in_one_line(overrides, message):
    cfg = compose_config(["experiment=smoke", *overrides])
    with pytest.raises(ConfigError) as error:
        validate_config(cfg)
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("mode", COMPILE_MODES)
@pytest.mark.parametrize("pipeline", ["classic", "functional"])
def test_compile_settings_accepted(pipeline, mode):
    run = ["experiment=smoke", f"pipeline={pipeline}", "balance=rr"]
    validate_config(compose_config([*run, "trainer.compile=true", f"trainer.compile_mode={mode}"]))


def test_compile_resolves_auto_to_the_func_method():
    eager = PerSamplePipeline(LeNet(), F.cross_entropy, method="auto")
    compiled = PerSamplePipeline(LeNet(), F.cross_entropy, method="auto", compile_mode="default")
    assert eager.method == "factored"
    assert compiled.method == "func"
    assert isinstance(compiled.per_sample, FuncPerSample)
    # compiling wraps the func path's vmap(grad), so its options hold compiled too
    dropout = make_per_sample(LeNet(), F.cross_entropy, compile_mode="default", randomness="same")
    assert dropout.method == "func" and dropout.randomness == "same"
    with pytest.raises(ValueError, match=r"^pipeline\.method: got 'hooks' with trainer\.compile"):
        PerSamplePipeline(LeNet(), F.cross_entropy, method="hooks", compile_mode="default")


def test_compile_off_keeps_the_run_directory():
    assert settings_hash([]) == ""  # the default (compile off) adds nothing to the path
    assert settings_hash(["trainer.compile=true"]) != ""


@pytest.mark.slow
def test_runner_trains_compiled_and_an_eager_run_loads_its_checkpoint(tmp_path):
    overrides = ["model=mlp", "model.hidden=[16]", "dataset.num_train=64", "dataset.num_test=32"]
    args = ["experiment=smoke", "epochs=1", "progress=none", "trainer.compile=true", "device=cpu"]
    args += overrides
    result = run_in_process(args, tmp_path, cli_env(), merge_stderr=False)
    assert result.returncode == 0, result.stderr[-3000:]
    (summary_path,) = (tmp_path / "outputs" / "smoke").rglob("summary.json")
    summary = json.loads(summary_path.read_text())
    assert summary["status"] == "finished"
    assert 0 < summary["final"]["train/loss"] < 10
    state = torch.load(summary_path.parent / CHECKPOINT_NAME, map_location="cpu", weights_only=True)
    eager = compose_job(overrides)  # trainer.compile=false
    model, ordering = eager.parts.model, eager.parts.ordering
    assert list(state["model"]) == list(model.state_dict())  # no "_orig_mod." prefixes
    model.load_state_dict(state["model"])  # strict
    eager.parts.optimizer.load_state_dict(state["optimizer"])
    ordering.load_state_dict(state["ordering"])
    assert ordering.epoch == 0 and ordering.pos == 64
    losses = train_epochs(eager, 1, start=1)  # the eager run continues the compiled one
    assert torch.isfinite(losses).all()


def test_distributed_job_validates_compile_settings(tmp_path):
    args = ["experiment=smoke", "distributed.simulate_workers=2", "balance=cd_grab"]
    result = run_cli([*args, "trainer.compile_mode=fast"], tmp_path)
    assert result.returncode != 0
    assert "trainer.compile_mode: got 'fast'; allowed: default" in result.stderr
