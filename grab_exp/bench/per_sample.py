"""Per-sample gradients' cost over a plain step, per model and method (real-size models).

Each model's step is timed as a plain ``loss.backward()``, as ``method=auto`` (the path it
resolves to), as ``func`` and as ``loop`` (one forward and backward per example, ``auto``'s last
resort), interleaved: every repeat times each method once, and
the medians are reported with their ratio to the plain step. A method that refuses a model is
reported with its one-line reason instead of a time. With ``--baseline <package>`` (another
version of grab_exp, importable under that name), that version's methods are timed in the same
process, interleaved with these, against the same plain step (``<method>@baseline``).
"""

from __future__ import annotations

import copy
import functools
import importlib
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from grab_exp.bench.machine import add_device_option, bench_parser, bench_report, write_report
from grab_exp.bench.timing import interleaved_seconds
from grab_exp.models import LeNet, WordLM, resnet18_gn
from grab_exp.per_sample import make_per_sample

BATCH = 16
#: the per-sample methods timed beside the plain step
METHODS = ("auto", "func", "loop")


class TransformerClassifier(nn.Module):
    """Token + position embeddings (vocab 5,000, d = 128), 2 encoder layers (4 heads, no
    dropout), mean pool, 10 classes; T = 64."""

    def __init__(self, vocab: int = 5000, width: int = 128, seq: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(seq, width)
        layer = nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(width, 10)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, 10)
        h = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        return self.head(self.encoder(h).mean(dim=1))


def _lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _images(g):
    return torch.randn(BATCH, 3, 32, 32, generator=g), torch.randint(0, 10, (BATCH,), generator=g)


#: name -> (model, batch maker from a generator, loss)
MODELS: dict[str, tuple[Callable[[], nn.Module], Callable, Callable]] = {
    "lenet": (LeNet, _images, F.cross_entropy),
    "resnet18_gn": (resnet18_gn, _images, F.cross_entropy),
    "lstm_lm": (
        functools.partial(WordLM, num_classes=10_000, width=256),
        lambda g: (
            torch.randint(0, 10_000, (BATCH, 35), generator=g),
            torch.randint(0, 10_000, (BATCH, 35), generator=g),
        ),
        _lm_loss,
    ),
    "transformer": (
        TransformerClassifier,
        lambda g: (torch.randint(0, 5000, (BATCH, 64), generator=g), torch.arange(BATCH) % 10),
        F.cross_entropy,
    ),
}


def _methods(
    model: nn.Module,
    loss_fn,
    x,
    y,
    unchecked: bool = False,
    methods_timed=METHODS,
    baseline: Callable | None = None,
) -> dict[str, Callable[[], object] | str]:
    """Method -> its step (each on its own copy of ``model``), or why it refuses the model;
    with ``unchecked`` also ``auto``'s path and ``func`` without the per-sample check
    (``auto:<path>@unchecked``, ``func@unchecked``: ``check_every=0``; the check's cost is the
    ratio of the two); with a ``baseline`` (another version's ``make_per_sample``), each of its
    steps too, as ``<name>@baseline``. Every step starts from ``param.grad = None``, as a
    training step does."""
    plain_model = copy.deepcopy(model)

    def plain():
        plain_model.zero_grad(set_to_none=True)
        loss_fn(plain_model(x), y).backward()

    methods: dict[str, Callable[[], object] | str] = {"plain": plain}
    makers = {"": make_per_sample} | ({"@baseline": baseline} if baseline else {})
    for method in methods_timed:
        for tag, make in makers.items():
            try:
                psg = make(copy.deepcopy(model), loss_fn, method)
                psg(x, y)  # the first call checks the path
            except (ValueError, RuntimeError) as error:
                methods[method + tag] = str(error).splitlines()[0]
                continue
            name = (f"auto:{psg.method}" if method == "auto" else method) + tag
            methods[name] = functools.partial(_step, psg, x, y)
            if unchecked and method != "loop":
                bare = make(copy.deepcopy(model), loss_fn, psg.method, check_every=0)
                methods[f"{name}@unchecked"] = functools.partial(_step, bare, x, y)
    return methods


def _step(psg, x, y) -> None:
    """One training step's per-sample part: ``param.grad`` cleared, then the call."""
    psg.model.zero_grad(set_to_none=True)
    psg(x, y)


#: untimed calls of each method first: the steady step, after the check's early calls
WARMUP = 16


def bench_model(
    name: str,
    repeats: int,
    device: torch.device,
    unchecked: bool = False,
    methods=METHODS,
    baseline: Callable | None = None,
) -> dict:
    """One model's row: each method's median ms per step and its ratio to the plain step
    (``unchecked``, ``baseline``: see :func:`_methods`; ``methods``: those timed besides the
    plain step)."""
    make, batch, loss_fn = MODELS[name]
    torch.manual_seed(0)
    model = make().to(device)
    x, y = (t.to(device) for t in batch(torch.Generator().manual_seed(0)))
    methods = _methods(model, loss_fn, x, y, unchecked, methods, baseline)
    timed = {m: f for m, f in methods.items() if callable(f)}
    # past the per-sample check's first calls (1, 2, 4, ..., 16: the epoch bench times the check)
    times = interleaved_seconds(timed, device, repeats, warmup=WARMUP)
    ms = {m: sorted(t)[len(t) // 2] * 1e3 for m, t in times.items()}
    return {
        "model": name,
        "parameters": sum(p.numel() for p in model.parameters()),
        "batch": BATCH,
        "ms": ms,
        "over_plain": {m: ms[m] / ms["plain"] for m in ms},
        "refused": {m: f for m, f in methods.items() if isinstance(f, str)},
    }


def build_parser():
    """The options of ``python -m grab_exp.bench per_sample``."""
    parser = bench_parser("per_sample", __doc__)
    parser.add_argument("--repeats", type=int, default=15, help="timed steps per method")
    parser.add_argument(
        "--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}"
    )
    parser.add_argument(
        "--unchecked",
        action="store_true",
        help="time auto's path and func without the per-sample check too (<method>@unchecked)",
    )
    parser.add_argument(
        "--methods",
        default=",".join(METHODS),
        help=f"comma-separated per-sample methods timed besides plain, of {', '.join(METHODS)}",
    )
    parser.add_argument(
        "--baseline",
        default=None,
        help="a package name (another version of grab_exp, importable under that name) whose "
        "per-sample methods are timed in the same process too, as <method>@baseline",
    )
    add_device_option(parser)
    return parser


def main(argv: list[str] | None = None) -> list[dict]:
    """Time every model's methods; print the table, write the JSON."""
    parser = build_parser()
    args = parser.parse_args(argv)
    names = args.models.split(",")
    methods = tuple(args.methods.split(","))
    unknown = [n for n in names if n not in MODELS]
    if unknown or args.repeats < 1:
        parser.error(
            f"--models: unknown {unknown} (allowed: {', '.join(MODELS)}), or --repeats < 1"
        )
    if not set(methods) <= set(METHODS):
        parser.error(
            f"--methods: {args.methods!r}; allowed: a comma-separated subset of "
            f"{', '.join(METHODS)}"
        )
    device = torch.device(args.device)
    baseline = None
    if args.baseline is not None:
        try:
            baseline = importlib.import_module(f"{args.baseline}.per_sample").make_per_sample
        except (ModuleNotFoundError, AttributeError):
            parser.error(
                f"--baseline: no package {args.baseline!r} with per_sample.make_per_sample on "
                "the path (scripts/per_sample_sitting.sh makes grab_exp_before)"
            )
    rows = [bench_model(n, args.repeats, device, args.unchecked, methods, baseline) for n in names]
    for row in rows:
        over = row["over_plain"]
        cells = "  ".join(f"{m} {ms:.1f} ms ({over[m]:.2f}x)" for m, ms in row["ms"].items())
        print(f"{row['model']:>12}: {cells}")
        for method, reason in row["refused"].items():
            print(f"{'':>12}  {method} refused: {reason}")
    write_report(args.out, bench_report("per_sample", args, device, rows=rows))
    return rows
