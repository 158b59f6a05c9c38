"""Models and losses of the adversarial per-sample suite (``tests/per_sample/test_adversarial.py``).

Each one reproduces a failure found in the per-sample paths: a model that reorders its batch, a
module with two outputs one computed from the other, reparametrized layers, cells looped a
varying number of times, a mixture of experts, HuggingFace models; losses that are not the batch
mean of per-example losses (``reduction="sum"``, class weights, padded token losses) and one that
reads the model's parameters (a weight penalty). All are small; the suite turns them to float64.
"""

from __future__ import annotations

import contextlib
import types
import warnings
from collections.abc import Iterator

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import prune
from torch.utils.checkpoint import checkpoint

IN, HIDDEN, CLASSES, VOCAB, PAD = 5, 7, 3, 20, 0


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run the block with the global torch RNG seeded, and give the RNG back as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def mlp(frozen_first: bool = False, classes: int = CLASSES) -> nn.Sequential:
    """Linear -> tanh -> Linear -> tanh -> Linear; the first layer frozen if asked."""
    model = nn.Sequential(
        nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
        nn.Linear(HIDDEN, classes),
    )  # fmt: skip
    if frozen_first:
        model[0].requires_grad_(False)
    return model


# -- 1. a batch permuted inside forward ----------------------------------------------------------


class SortedBatch(nn.Module):
    """Sorts the examples by ``x.sum(1)``, runs its layers on the sorted batch, unsorts the
    output (what RNN code around ``pack_padded_sequence(enforce_sorted=False)`` does)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin1 = nn.Linear(IN, HIDDEN)
        self.lin2 = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        order = x.sum(1).argsort()
        h = self.lin2(torch.tanh(self.lin1(x[order])))
        return h[order.argsort()]


# -- 2. a module with its own parameter and two outputs, one a function of the other ------------


class TwoOutputs(nn.Module):
    """``h = x @ W`` and ``z = tanh(h) @ V`` (``V`` a fixed buffer): both returned; no per-layer
    rule knows this module."""

    def __init__(self) -> None:
        super().__init__()
        self.W = nn.Parameter(torch.randn(IN, HIDDEN) / IN**0.5)
        self.register_buffer("V", torch.randn(HIDDEN, 4))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x @ self.W
        return h, torch.tanh(h) @ self.V


class AuxModel(nn.Module):
    """:class:`TwoOutputs` then a head on ``h``; returns ``(logits, z)``."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = TwoOutputs()
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h, z = self.enc(x)
        return self.head(h), z


class AuxLoss:
    """``ce(logits, y) + aux_w * mean_b(mean_j z_bj**2)``; ``aux_w`` is set by the test (warm-up
    schedule)."""

    def __init__(self) -> None:
        self.aux_w = 0.0

    def __call__(self, out: tuple[torch.Tensor, torch.Tensor], y: torch.Tensor) -> torch.Tensor:
        logits, z = out
        return F.cross_entropy(logits, y) + self.aux_w * z.pow(2).mean(dim=1).mean()


# -- 3. a weight penalty inside the loss --------------------------------------------------------


class PenaltyLoss:
    """``ce + lam * sum_p ||p||^2`` over ``model``'s parameters; :meth:`rebind` gives the same
    loss (current ``lam``) for a copy of the model."""

    def __init__(self, model: nn.Module, lam: float) -> None:
        self.model, self.lam = model, lam

    def __call__(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        penalty = sum(p.pow(2).sum() for p in self.model.parameters())
        return F.cross_entropy(out, y) + self.lam * penalty

    def rebind(self, model: nn.Module) -> PenaltyLoss:
        return PenaltyLoss(model, self.lam)


# -- 4. losses that are not the mean of per-example losses ---------------------------------------

#: class 3 weighs 4, the others 1: a batch without class 3 (or with class 3 only) is a plain mean
CLASS_WEIGHT = torch.tensor([1.0, 1.0, 1.0, 4.0], dtype=torch.float64)


def weighted_ce(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, y, weight=CLASS_WEIGHT.to(out.dtype))


def sum_ce(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, y, reduction="sum")


def token_lm_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Token-level LM loss: mean over the batch's non-``PAD`` tokens."""
    return F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=PAD)


def lm_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Token-level LM loss without padding (every example has ``T`` tokens)."""
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


class TokenLM(nn.Module):
    """Embedding -> tanh(Linear) -> Linear over the vocabulary: ``(B, T) -> (B, T, V)``."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 6)
        self.mix = nn.Linear(6, 6)
        self.out = nn.Linear(6, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.mix(self.embed(tokens))))


# -- 5. a model that mixes the examples ----------------------------------------------------------


class Centering(nn.Module):
    """Subtracts the batch mean before its first Linear: the examples are mixed."""

    def __init__(self) -> None:
        super().__init__()
        self.body = mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x - x.mean(0, keepdim=True))


# -- 6. InstanceNorm with running statistics -------------------------------------------------------


class InstanceNet(nn.Module):
    """Conv -> InstanceNorm2d(affine, track_running_stats) -> ReLU -> pool -> Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3)
        self.norm = nn.InstanceNorm2d(3, affine=True, track_running_stats=True)
        self.head = nn.Linear(3 * 2 * 2, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 2, 6, 6)
        h = F.avg_pool2d(F.relu(self.norm(self.conv(x))), 2)  # (B, 3, 2, 2)
        return self.head(h.flatten(1))


# -- 7. layers that do not run --------------------------------------------------------------------


class UnusedPooler(nn.Module):
    """An MLP with a ``pooler`` Linear that forward never calls."""

    def __init__(self) -> None:
        super().__init__()
        self.body = mlp()
        self.pooler = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class TinyMoE(nn.Module):
    """Top-1 mixture of 4 experts: each expert runs on the examples routed to it (none, in some
    batches), its output scaled by the gate's probability."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(IN, HIDDEN)
        self.gate = nn.Linear(HIDDEN, 4)
        self.experts = nn.ModuleList(nn.Linear(HIDDEN, HIDDEN) for _ in range(4))
        self.head = nn.Linear(HIDDEN, CLASSES)

    def route(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate(torch.tanh(self.enc(x))).argmax(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.enc(x))
        probs = self.gate(h).softmax(1)
        route = probs.argmax(1)
        out = torch.zeros_like(h)
        for k, expert in enumerate(self.experts):
            mask = route == k
            if mask.any():
                out[mask] = expert(h[mask]) * probs[mask, k].unsqueeze(1)
        return self.head(out)


# -- 8. reparametrized layers --------------------------------------------------------------------


class LoRALinear(nn.Linear):
    """A Linear with a frozen base weight and a trainable low-rank update ``B @ A``."""

    def __init__(self, fan_in: int, fan_out: int, rank: int = 2) -> None:
        super().__init__(fan_in, fan_out)
        self.weight.requires_grad_(False)
        self.lora_A = nn.Parameter(torch.randn(rank, fan_in) / fan_in**0.5)
        self.lora_B = nn.Parameter(torch.randn(fan_out, rank) / rank**0.5)  # not zero: both learn
        self.scale = 0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias) + self.scale * (
            x @ self.lora_A.T @ self.lora_B.T
        )


def reparametrized(kind: str) -> nn.Sequential:
    """An MLP whose first layer is reparametrized: ``weight_norm`` (parametrizations),
    ``old_weight_norm`` (``torch.nn.utils.weight_norm``), ``prune`` (L1, 30%) or ``lora``."""
    if kind == "lora":
        first: nn.Module = LoRALinear(IN, HIDDEN)
    else:
        first = nn.Linear(IN, HIDDEN)
        if kind == "weight_norm":
            first = nn.utils.parametrizations.weight_norm(first)
        elif kind == "old_weight_norm":
            with warnings.catch_warnings():  # deprecated in favour of parametrizations
                warnings.simplefilter("ignore")
                first = nn.utils.weight_norm(first)
        elif kind == "prune":
            prune.l1_unstructured(first, "weight", amount=0.3)
        else:
            raise ValueError(kind)
    return nn.Sequential(first, nn.Tanh(), nn.Linear(HIDDEN, CLASSES))


# -- 10. a position embedding without a batch dimension ------------------------------------------


class PositionModel(nn.Module):
    """Token embedding + ``pos(arange(T))`` (``(T, D)``, no batch dim), mean pool, head."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, 6)
        self.pos = nn.Embedding(8, 6)
        self.mix = nn.Linear(6, 6)
        self.head = nn.Linear(6, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))
        return self.head(torch.tanh(self.mix(h)).mean(1))


# -- 11. keyword inputs, activation checkpointing --------------------------------------------------


class MaskedPool(nn.Module):
    """HuggingFace-style ``forward(input_ids, attention_mask)``: embedding, masked mean pool,
    Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 6)
        self.mix = nn.Linear(6, 6)
        self.head = nn.Linear(6, CLASSES)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.mix(self.embed(input_ids)))  # (B, T, 6)
        mask = attention_mask.unsqueeze(-1).to(h.dtype)
        return self.head((h * mask).sum(1) / mask.sum(1))


class Checkpointed(nn.Module):
    """Linear, then a block run under ``torch.utils.checkpoint``, then a head."""

    def __init__(self, use_reentrant: bool) -> None:
        super().__init__()
        self.use_reentrant = use_reentrant
        self.inp = nn.Linear(IN, HIDDEN)
        self.block = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN))
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inp(x))
        h = checkpoint(self.block, h, use_reentrant=self.use_reentrant)
        return self.head(torch.tanh(h))


# -- 12. HuggingFace models ----------------------------------------------------------------------


class HFLogits(nn.Module):
    """A HuggingFace model as ``input_ids -> logits``."""

    def __init__(self, hf: nn.Module) -> None:
        super().__init__()
        self.hf = hf

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.hf(input_ids=input_ids).logits


def tiny_gpt2() -> HFLogits:
    """A 2-layer GPT-2 LM from a config (no weights), its default dropout (0.1) kept."""
    import transformers

    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=16, vocab_size=50, n_positions=16)
    return HFLogits(transformers.GPT2LMHeadModel(config))


def tiny_bert() -> HFLogits:
    """A 2-layer BERT sequence classifier (2 labels) from a config, its default dropout kept."""
    import transformers

    config = transformers.BertConfig(
        hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        vocab_size=50, max_position_embeddings=16,
    )  # fmt: skip
    return HFLogits(transformers.BertForSequenceClassification(config))


# -- 13, 14. recurrent cells and layers ------------------------------------------------------------


class CellLoop(nn.Module):
    """``nn.LSTMCell`` or ``nn.GRUCell`` looped over the ``T`` steps of ``(B, T, F)``; the cell
    is called ``T`` times, a number that changes from batch to batch."""

    def __init__(self, cell: str) -> None:
        super().__init__()
        self.kind = cell
        self.cell = nn.LSTMCell(IN, HIDDEN) if cell == "LSTM" else nn.GRUCell(IN, HIDDEN)
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.new_zeros(x.shape[0], HIDDEN)
        c = x.new_zeros(x.shape[0], HIDDEN)
        for t in range(x.shape[1]):
            if self.kind == "LSTM":
                h, c = self.cell(x[:, t], (h, c))
            else:
                h = self.cell(x[:, t], h)
        return self.head(h)


class LSTMClassifier(nn.Module):
    """``nn.LSTM`` (batch first) classified from its last output."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(IN, HIDDEN, batch_first=True)
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


# -- 17-22. found by the hostile review of the every-call check -----------------------------------


class CenterFeatures(nn.Module):
    """An MLP's features ``f (B, 4)`` and logits; ``centers`` (an Embedding of one centre per
    class) is never called by forward: only :class:`CenterLoss` reads it, per example."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 4))
        self.centers = nn.Embedding(CLASSES, 4)
        self.head = nn.Linear(4, CLASSES)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = self.body(x)
        return f, self.head(f)


class CenterLoss:
    """Center loss (Wen et al., 2016): ``ce + lam * mean_b ||f_b - centers[y_b]||^2``, a
    per-example term on a parameter the model's forward does not use; ``lam`` is set by the
    test (warm-up schedule); :meth:`rebind` gives the same loss for a copy of the model."""

    def __init__(self, model: nn.Module, lam: float = 0.0) -> None:
        self.model, self.lam = model, lam

    def __call__(self, out: tuple[torch.Tensor, torch.Tensor], y: torch.Tensor) -> torch.Tensor:
        f, logits = out
        centers = self.model.centers.weight[y]  # (B, 4): each example's own class centre
        return F.cross_entropy(logits, y) + self.lam * (f - centers).pow(2).sum(1).mean()

    def rebind(self, model: nn.Module) -> CenterLoss:
        return CenterLoss(model, self.lam)


def repeated_block() -> nn.Sequential:
    """An MLP whose middle Linear is the SAME module at positions 2 and 4 (a block applied
    twice, as in weight-shared / recurrent-depth nets)."""
    block = nn.Linear(HIDDEN, HIDDEN)
    return nn.Sequential(
        nn.Linear(IN, HIDDEN), nn.Tanh(), block, nn.Tanh(), block, nn.Tanh(),
        nn.Linear(HIDDEN, CLASSES),
    )  # fmt: skip


class StepCounter(nn.Module):
    """An MLP that counts its training forwards and keeps an EMA of its inputs in buffers
    updated out of place (``self.steps = self.steps + 1``: the buffer is a new tensor each
    forward), as observation normalizers do."""

    def __init__(self) -> None:
        super().__init__()
        self.body = mlp()
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.register_buffer("ema", torch.zeros(IN))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.steps = self.steps + 1
            self.ema = 0.9 * self.ema + 0.1 * x.detach().mean(0)
        return self.body(x)


# -- 26-31. found by the second review ------------------------------------------------------------


def policy_mlp() -> nn.Sequential:
    """A policy network whose action head starts at zero (CleanRL's actor head uses std 0.01;
    zero is its limit): every example's log-probabilities are equal at first."""
    model = mlp()
    nn.init.zeros_(model[4].weight)
    nn.init.zeros_(model[4].bias)
    return model


def pg_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """REINFORCE / PPO's policy term: ``-(log pi(a | x) * advantage).mean()``, ``y = (action,
    advantage)`` per example (the advantages normalized over the rollout: their mean is 0)."""
    logp = out.log_softmax(-1).gather(1, y[:, :1].long()).squeeze(1)
    return -(logp * y[:, 1]).mean()


def inplace_relu_mlp() -> nn.Sequential:
    """Linear -> ReLU(inplace=True) -> Linear -> ReLU(inplace=True) -> Linear (torchvision's
    classifier heads): each Linear's output is changed in place after its call."""
    return nn.Sequential(
        nn.Linear(IN, HIDDEN), nn.ReLU(inplace=True), nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(inplace=True), nn.Linear(HIDDEN, CLASSES),
    )  # fmt: skip


class SqueezedOutput(nn.Module):
    """A regression MLP that returns ``head(h).squeeze()`` (``(B,)``; ``()`` for one example);
    with ``tied``, a second Linear shares the first one's weight (so ``auto`` takes ``func``)."""

    def __init__(self, tied: bool = False) -> None:
        super().__init__()
        self.a, self.head = nn.Linear(IN, IN), nn.Linear(IN, 1)
        self.b = nn.Linear(IN, IN) if tied else None
        if self.b is not None:
            self.b.weight = self.a.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.a(x))
        if self.b is not None:
            h = torch.tanh(self.b(h))
        return self.head(h).squeeze()


def squeezed_mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out.reshape(-1), y)


class KLHead(nn.Module):
    """A Bayes-by-backprop style head: returns ``(logits, kl)``, ``kl`` a scalar of its
    parameters only (the same for every example and every batch)."""

    def __init__(self) -> None:
        super().__init__()
        self.mu = nn.Linear(HIDDEN, CLASSES)
        self.log_sigma = nn.Parameter(torch.full((CLASSES, HIDDEN), -3.0))

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        sigma2 = self.log_sigma.exp() ** 2
        kl = 0.5 * (self.mu.weight**2 + sigma2 - 2 * self.log_sigma).sum()
        return self.mu(h), kl


class KLModel(nn.Module):
    """Linear -> tanh -> :class:`KLHead`: ``(logits (B, C), kl ())``."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh())
        self.head = KLHead()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.head(self.body(x))


def elbo_loss(out: tuple[torch.Tensor, torch.Tensor], y: torch.Tensor) -> torch.Tensor:
    """``ce + kl / N`` (N = 1000 training examples): each example's loss is its ``ce`` plus the
    same ``kl / N``, so the batch loss is their mean."""
    logits, kl = out
    return F.cross_entropy(logits, y) + kl / 1000


# -- 31-34. a fourth review: what changes a layer's output around the hook path -----------------


def hooked_mlp(kind: str) -> nn.Sequential:
    """:func:`mlp` whose first Linear has a forward hook of the user's: ``replace`` returns a new
    output, ``inplace`` changes the output in place."""
    model = mlp()
    if kind == "replace":
        model[0].register_forward_hook(lambda module, args, out: torch.sin(out) * 2)
    else:
        model[0].register_forward_hook(lambda module, args, out: out.mul_(3).sin_())
    return model


def instance_forward_mlp() -> nn.Sequential:
    """:func:`mlp` whose first Linear's ``forward`` is replaced on the instance (its weight
    halved inside)."""
    model = mlp()
    first = model[0]
    first.forward = types.MethodType(
        lambda self, x: F.linear(x, self.weight * 0.5, self.bias), first
    )
    return model


class InPlaceSequence(nn.Module):
    """A Linear on ``(B, T, IN)`` inputs (its output a view), changed in place after it returns:
    an in-place ReLU (``relu``) or a residual add (``residual``); mean over T, then a head."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.fc = nn.Linear(IN, IN)
        self.head = nn.Linear(IN, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, IN) -> (B, CLASSES)
        h = self.fc(x)  # (B, T, IN), a view
        if self.kind == "relu":
            h.relu_()
        else:
            h += x
        return self.head(h.mean(dim=1))


def clamping_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of logits clamped IN PLACE: the loss changes the model's output."""
    return F.cross_entropy(out.clamp_(-0.5, 0.5), y)


class ReusedThenChanged(nn.Module):
    """A Linear called twice (``h1``, then ``h2`` from ``tanh(h1)``), ``h1`` changed in place
    after the second call: the tensor ``h1`` has another autograd node by the loss's time."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.head = nn.Linear(IN, IN), nn.Linear(IN, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h1 = self.a(x)
        h2 = self.a(torch.tanh(h1))
        h1.relu_()
        return self.head(h1 + h2)


class ExpShift(nn.Module):
    """``exp(x + b)``: a custom layer with a parameter (replayed by the hook path)."""

    def __init__(self) -> None:
        super().__init__()
        self.b = nn.Parameter(torch.randn(HIDDEN) * 0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(x + self.b)


class ScaleInPlace(nn.Module):
    """``x.mul_(s)``: a custom layer that changes its input in place and returns it."""

    def __init__(self) -> None:
        super().__init__()
        self.s = nn.Parameter(torch.rand(HIDDEN) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mul_(self.s)


class InputChanged(nn.Module):
    """Linear -> a replayed layer, whose input is then changed in place (``after``: ``h.relu_()``
    after the layer's call) or by the layer itself (``during``: :class:`ScaleInPlace`)."""

    def __init__(self, when: str) -> None:
        super().__init__()
        self.when = when
        self.a, self.head = nn.Linear(IN, HIDDEN), nn.Linear(HIDDEN, CLASSES)
        self.layer = ExpShift() if when == "after" else ScaleInPlace()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        z = self.layer(h)
        if self.when == "after":
            h.relu_()
            z = 0.1 * z + h
        return self.head(z)
