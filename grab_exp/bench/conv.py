"""Per-sample ``Conv2d`` weight gradients: which formulation is fastest at which shape.

For each layer shape, every formulation runs on the same input ``a (B, C, H, W)`` and output
gradient ``g (B, O, H', W')``, interleaved (formulation 1, 2, ..., 1, 2, ...), each call timed on
its own; a row's time is the median. Formulations:

* ``grouped_forward``: a grouped forward convolution with the channels as the batch, every
  example's output gradient as a group's kernel, stride and dilation swapped (what
  :func:`~grab_exp.per_sample.rules.conv2d.conv2d_grads` did before);
* ``groups_weight_grad``: the batch as the groups of one convolution's weight gradient
  (``torch.nn.grad.conv2d_weight``), default layout;
* ``groups_weight_grad_cl``: the same in channels-last (the layout conversion is timed too);
* ``unfold_bmm``: the ``(B, C*kh*kw, L)`` patches and one batched matmul;
* ``ours``: :func:`~grab_exp.per_sample.rules.conv2d.conv2d_grads` (weight and bias), which
  picks channels-last on the CPU below ``CHANNELS_LAST_BELOW`` input channels;
* ``classic``: the batch-summed weight gradient of ``loss.backward()``, the price of no
  per-sample gradients.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from torch import nn
from torch.nn import functional as F

from grab_exp.bench.machine import add_device_option, bench_parser, bench_report, write_report
from grab_exp.bench.timing import interleaved_seconds
from grab_exp.per_sample.rules.conv2d import conv2d_grads

#: ``(C, O, kernel, H)``: LeNet's two convolutions, then wider and deeper layers
SHAPES = (
    (3, 6, 5, 32),
    (6, 16, 5, 14),
    (3, 32, 5, 32),
    (3, 32, 3, 32),
    (6, 16, 3, 14),
    (8, 8, 5, 16),
    (8, 8, 3, 16),
    (16, 16, 3, 16),
    (32, 32, 3, 8),
)


def formulations(layer: nn.Conv2d, a: torch.Tensor, g: torch.Tensor) -> dict:
    """Name -> a call computing the ``(B, O, C, kh, kw)`` per-sample weight gradients."""
    batch, out_channels = g.shape[:2]
    size = (batch * out_channels, *layer.weight.shape[1:])  # (B*O, C, kh, kw)
    images, grads = a.reshape(1, -1, *a.shape[2:]), g.reshape(1, -1, *g.shape[2:])
    last = torch.channels_last
    weight_grad = torch.nn.grad.conv2d_weight

    def grouped_forward():
        weight = F.conv2d(
            a.transpose(0, 1), g.reshape(-1, 1, *g.shape[2:]), groups=batch
        )  # (C, B*O, kh, kw)
        return weight.reshape(-1, batch, out_channels, *weight.shape[2:]).permute(1, 2, 0, 3, 4)

    def unfold_bmm():
        patches = F.unfold(a, layer.kernel_size)  # (B, C*kh*kw, L)
        return torch.bmm(g.flatten(2), patches.transpose(1, 2))  # (B, O, C*kh*kw)

    return {
        "grouped_forward": grouped_forward,
        "groups_weight_grad": lambda: weight_grad(images, size, grads, groups=batch),
        "groups_weight_grad_cl": lambda: weight_grad(
            images.contiguous(memory_format=last),
            size,
            grads.contiguous(memory_format=last),
            groups=batch,
        ),
        "unfold_bmm": unfold_bmm,
        "ours": lambda: conv2d_grads(layer, a, g),
        "classic": lambda: weight_grad(a, layer.weight.shape, g),
    }


def bench_shape(shape: tuple, batch: int, repeats: int, device: torch.device) -> dict:
    """Median ms of every formulation at one ``(C, O, kernel, H)``."""
    channels, out_channels, kernel, height = shape
    generator = torch.Generator().manual_seed(0)
    layer = nn.Conv2d(channels, out_channels, kernel).to(device)
    a = torch.randn(batch, channels, height, height, generator=generator).to(device)
    g = torch.randn(layer(a).shape, generator=generator).to(device)
    times = interleaved_seconds(formulations(layer, a, g), device, repeats)
    medians = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    return {"C": channels, "O": out_channels, "kernel": kernel, "H": height, "ms": medians}


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m grab_exp.bench conv``."""
    parser = bench_parser("conv", __doc__)
    parser.add_argument("--batch", type=int, default=16, help="examples per batch (B)")
    parser.add_argument("--repeats", type=int, default=100, help="timed calls per formulation")
    add_device_option(parser)
    return parser


def main(argv: list[str] | None = None) -> list[dict]:
    """Time every formulation at every shape; print the table, write the JSON."""
    args = build_parser().parse_args(argv)
    device = torch.device(args.device)
    rows = [bench_shape(shape, args.batch, args.repeats, device) for shape in SHAPES]
    names = list(rows[0]["ms"])
    print("C -> O, k, H".ljust(18) + "".join(f"{n:>23}" for n in names))
    for row in rows:
        label = f"{row['C']} -> {row['O']}, {row['kernel']}, {row['H']}"
        print(label.ljust(18) + "".join(f"{row['ms'][n]:>23.3f}" for n in names))
    write_report(args.out, bench_report("conv", args, device, rows=rows))
    return rows
