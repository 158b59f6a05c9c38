"""Build the objects of a job from its composed config: model, optimizer, ordering, pipeline."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig

from grab_exp.data import ArrayData
from grab_exp.losses import Loss
from grab_exp.optim import CLIP_HIGH, CLIP_LOW, GSNROptimizer
from grab_exp.runner.config.check import option_name
from grab_exp.runner.config.schema import ConfigError
from grab_exp.runner.training.capture import CapturedStep, capture_step
from grab_exp.runner.training.step import StepParts
from grab_exp.runner.training.strategy import Strategy

TRAINING_COLUMNS = (  # what every job logs per epoch
    "epoch",
    "train/loss",
    "train/acc",
    "test/loss",
    "test/acc",
    "train/running_loss",
    "time/epoch_s",
    "mem/peak_cuda_mb",
    "mem/step_peak_cuda_mb",
    "mem/peak_rss_mb",
    "mem/sorter_bytes",  # the ordering's state; the name committed runs and W&B projects use
)
GSNR_COLUMNS = (CLIP_LOW, CLIP_HIGH)  # only for VRGD optimizers
PERPLEXITY_COLUMNS = ("train/ppl", "test/ppl")  # only for a loss whose exp is a perplexity


@dataclass
class TrainingJob:
    """Everything one job trains with (data already on the strategy's device)."""

    parts: StepParts
    data: ArrayData
    strategy: Strategy
    batch_size: int
    eval_batch_size: int
    captured: CapturedStep | None = None  # ``trainer.cuda_graph``: full batches replay it

    @property
    def metric_columns(self) -> tuple[str, ...]:
        """The columns of this job's metrics.csv."""
        gsnr = GSNR_COLUMNS if self.parts.uses_gsnr else ()
        ppl = PERPLEXITY_COLUMNS if self.parts.loss.perplexity else ()
        return TRAINING_COLUMNS + self.strategy.extra_columns + gsnr + ppl


def compile_mode(cfg: DictConfig) -> str | None:
    """``trainer.compile_mode`` when ``trainer.compile`` is true, else ``None`` (eager)."""
    return cfg.trainer.compile_mode if cfg.trainer.compile else None


def data_options(cfg: DictConfig, data: ArrayData) -> dict[str, int]:
    """The model options that ``cfg`` leaves to the data (``null``): ``num_classes`` (the
    data's class count, a vocabulary's size) and ``in_features`` (the values of one image)."""
    sizes = {"num_classes": data.num_classes}
    if data.train_x.is_floating_point():
        sizes["in_features"] = math.prod(data.train_x.shape[1:])
    model = cfg.model
    return {key: size for key, size in sizes.items() if key in model and model[key] is None}


def build_parts(
    cfg: DictConfig, n: int, strategy: Strategy, model_options: dict | None = None
) -> StepParts:
    """Model (seeded init), optimizer, ordering of ``n`` examples and pipeline of ``cfg``;
    ``model_options`` fill the model's options left to the data (:func:`data_options`)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = instantiate(cfg.model, **(model_options or {})).to(strategy.device)
    optimizer = instantiate(cfg.optimizer)(model.parameters())
    if isinstance(optimizer, GSNROptimizer):  # every batch (the last, short one too) splits
        try:
            optimizer.check_batches(cfg.batch_size, n)
        except ValueError as error:
            raise ConfigError(str(error)) from error
    d = sum(p.numel() for p in model.parameters() if p.requires_grad)
    ordering = strategy.make_ordering(instantiate(cfg.balance), n, d, cfg.seed)
    make_pipeline = instantiate(cfg.pipeline)
    per_sample = get_class(cfg.pipeline._target_).provides_per_sample
    options = {"factors": ordering.takes_factors} if per_sample else {}
    loss = instantiate(cfg.loss)
    if not isinstance(loss, Loss):  # the job reads its total and perplexity too
        raise ConfigError(
            f"loss: {cfg.loss._target_} made a {type(loss).__name__}; allowed: a "
            "grab_exp.losses.Loss subclass (its __call__ the batch mean, its total the sum; "
            "docs/your-experiment.md)"
        )
    pipeline = make_pipeline(model=model, loss_fn=loss, compile_mode=compile_mode(cfg), **options)
    reducer = strategy.gradient_reducer(model)
    return StepParts(model, optimizer, pipeline, ordering, reducer, loss=loss)


def check_fit(model: torch.nn.Module, data: ArrayData, cfg: DictConfig) -> None:
    """Refuse, in one line naming both settings, a model whose output does not fit the data:
    one that does not take the data's inputs, or whose outputs per example are not the data's
    class count. Two training examples go through the model in eval mode, without gradients
    and with the random number generators put back: nothing of the run changes."""
    x = data.train_x[:2]
    dataset = f"dataset={option_name(cfg, 'dataset')}"
    name = type(model).__name__
    training = model.training
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            out = model.eval()(x)
    except (RuntimeError, ValueError, TypeError) as error:
        cause = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ConfigError(
            f"model: {name} does not take the inputs of {dataset}, shape "
            f"{tuple(x.shape[1:])} per example ({cause}); set the model's input size to them"
        ) from None
    finally:
        model.train(training)
    classes = data.num_classes
    want = (*data.train_y[: len(x)].shape, classes)  # (2, C), or (2, T, C) with a label per word
    if not isinstance(out, torch.Tensor) or out.shape != want:
        shape = tuple(out.shape[1:]) if isinstance(out, torch.Tensor) else type(out).__name__
        setting = "model.num_classes" if "num_classes" in cfg.model else "model"
        raise ConfigError(
            f"{setting}: {name} outputs {shape} per example but {dataset} has {classes} "
            f"classes; allowed: {classes} logits per example (model.num_classes={classes})"
        )


def build_job(cfg: DictConfig, data: ArrayData, strategy: Strategy) -> TrainingJob:
    """The step's parts (:func:`build_parts`) for ``data``, captured with ``trainer.cuda_graph``.

    Raises:
        ConfigError: the model does not fit the data (:func:`check_fit`).
    """
    parts = build_parts(cfg, len(data.train_y), strategy, data_options(cfg, data))
    check_fit(parts.model, data, cfg)
    captured = capture_step(parts) if cfg.trainer.cuda_graph else None
    return TrainingJob(parts, data, strategy, cfg.batch_size, cfg.eval_batch_size, captured)
