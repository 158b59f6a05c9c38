"""What modules do to per-sample gradients (BatchNorm and a frequency-scaled Embedding mix the
examples, dropout draws random numbers), and the errors every path raises."""

from __future__ import annotations

from torch import nn

BATCHNORM = (nn.modules.batchnorm._BatchNorm, nn.SyncBatchNorm)
#: base of Dropout, Dropout1d/2d/3d, AlphaDropout and FeatureAlphaDropout
DROPOUT = (nn.modules.dropout._DropoutNd,)
#: the module types whose mode or configuration :func:`module_problem` reads
WATCHED = (*BATCHNORM, *DROPOUT, nn.Embedding)


#: reentrant activation checkpointing cannot give gradients at chosen tensors, nor run under vmap
CHECKPOINT_REFUSAL = (
    "torch.utils.checkpoint with use_reentrant=True supports only loss.backward(), not the "
    "gradients at chosen tensors or the vmap per-sample gradients need; use use_reentrant=False"
)


def label(name: str, module: nn.Module) -> str:
    return f"{name or '<root>'} ({type(module).__name__})"


def advice(method: str) -> str:
    return "use method=loop (auto takes it)" if method == "func" else "use method=func or loop"


def first_line(error: BaseException) -> str:
    """The error's message's first line (``""`` for none)."""
    return (str(error).strip().splitlines() or [""])[0]


class UnsupportedModelError(ValueError):
    """A layer (or the loss) whose per-sample gradients a path cannot compute right, in one line."""


class UserCodeError(Exception):
    """The user's own model or loss (``setting``) raised ``error`` in a file of theirs, and a
    plain step raises it too: their code's error, not a refusal; ``target``: ``module.name``."""

    def __init__(self, setting: str, target: str, error: BaseException) -> None:
        first = type(error).__name__ + (f": {line}" if (line := first_line(error)) else "")
        super().__init__(f"{setting}: {target} raised {first}")
        self.setting, self.target, self.error = setting, target, error


class RelayedError(UnsupportedModelError):
    """A refusal relaying torch's error, raised inside a method: it names where, not why."""


class InputChangedError(UnsupportedModelError):
    """The model or the loss changed the call's inputs or targets in place: every method runs
    them more than once on a batch (refused by all; ``auto`` tries no other)."""

    def __init__(self, where: str) -> None:
        who = "loss_fn" if where.startswith("y") else "the model's forward"
        super().__init__(
            f"{who} changed {where} in place during the call (x /= 2, y -= 1, a dict's pop): "
            "per-sample methods run the model and the loss more than once on a batch (their "
            "checks, an example alone, auto's next method), each time on what the last run left; "
            "change a copy instead (x = x / 2, dict(extras))"
        )


class LossContractError(UnsupportedModelError):
    """A loss that is not the batch mean of per-example losses: no method can use it."""


class ModuleSettingError(UnsupportedModelError):
    """A module's mode or setting that every method refuses (:func:`module_problem`: BatchNorm in
    training mode, a frequency-scaled Embedding; trainable parameters of two dtypes, or complex)
    or that needs a setting of the call's (dropout without ``randomness`` on ``func``)."""


def module_problem(
    name: str, module: nn.Module, randomness: str | None, module_dropout: bool = False
) -> str | None:
    where = label(name, module)
    if isinstance(module, nn.Embedding) and module.scale_grad_by_freq:
        return (
            f"{where} with scale_grad_by_freq=True: its gradient divides by each token's count "
            "in the whole batch, so the batch's gradient is not the mean of per-example ones; "
            "set scale_grad_by_freq=False"
        )
    if isinstance(module, BATCHNORM) and (module.training or module.running_mean is None):
        mode = "in training mode" if module.training else "without running statistics"
        return (
            f"{where} {mode}: per-sample gradients are undefined because batch statistics mix "
            "the examples of a batch; use eval mode with running statistics (fine-tuning), or "
            "grab_exp.per_sample.batchnorm_to_groupnorm(model) to train with GroupNorm"
        )
    dropout = isinstance(module, DROPOUT) and module.training and module.p > 0
    if dropout and randomness is None and not module_dropout:
        return (
            f"{where} with p={module.p} in training mode needs an explicit randomness setting: "
            "method=func with randomness='different' (independent masks per example) or "
            "'same', method=hooks or auto (the batch's own masks), or put it in eval mode"
        )
    return None


def draws_random(module: nn.Module) -> bool:
    """Whether ``module`` itself draws random numbers in its current mode: a Dropout or
    torchvision's StochasticDepth (ConvNeXt, Swin) with ``p > 0``, or a MultiheadAttention's or
    multi-layer RNN's own ``dropout``, in training mode."""
    if not module.training:
        return False
    if isinstance(module, DROPOUT) or type(module).__name__ == "StochasticDepth":
        return module.p > 0
    if isinstance(module, nn.RNNBase):
        return module.num_layers > 1 and module.dropout > 0
    return isinstance(module, nn.MultiheadAttention) and module.dropout > 0


def random_modules(module: nn.Module) -> list[str]:
    """Names of ``module``'s submodules (itself included) that :func:`draws_random`."""
    return [name for name, sub in module.named_modules() if draws_random(sub)]


def compiled(module: nn.Module) -> bool:
    """Whether ``module`` is ``torch.compile``'s wrapper of a module (``OptimizedModule``)."""
    return type(module).__name__ == "OptimizedModule" and "_orig_mod" in module._modules
