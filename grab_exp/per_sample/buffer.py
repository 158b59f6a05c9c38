"""The reused ``(B, d)`` buffer of the hook path's per-sample gradients."""

from __future__ import annotations

import torch
from torch import nn

Grads = dict[str, torch.Tensor]


class GradBuffer:
    """One row-major ``(rows >= B, d)`` buffer and its per-parameter ``(B, *shape)`` views.

    Columns follow the trainable parameters in ``named_parameters`` order, so the views of one
    call are consecutive column blocks: :func:`~grab_exp.grads.batch.as_batch_grads` makes them
    one block, the buffer itself.
    """

    def __init__(self) -> None:
        self.buffer: torch.Tensor | None = None  # (rows >= B, d)
        self._shapes: dict[str, torch.Size] = {}  # trainable name -> shape: the layout
        self._views: dict[int, Grads] = {}  # B -> name -> (B, *shape) views of the buffer

    def views(
        self, model: nn.Module, batch: int, trainable: list[str], tensors: list[torch.Tensor]
    ) -> Grads:
        """Name -> ``(B, *shape)`` column blocks of the buffer (``{}``: write fresh tensors).

        Args:
            model: The model (read for the parameters' shapes when the layout changes).
            batch: ``B``.
            trainable: Names of the trainable parameters, in ``named_parameters`` order.
            tensors: The layers' inputs and output gradients: the buffer takes their dtype and
                device; when they mix dtypes or devices (or there are none), ``{}``.
        """
        if not tensors:
            return {}
        like = tensors[0]
        if any(t.dtype != like.dtype or t.device != like.device for t in tensors):
            return {}
        if list(self._shapes) != trainable:  # first call, or parameters were (un)frozen
            shapes = dict(model.named_parameters())
            self._shapes = {n: shapes[n].shape for n in trainable}
            self.buffer = None
        buffer = self.buffer
        small = buffer is None or len(buffer) < batch
        if small or buffer.dtype != like.dtype or buffer.device != like.device:
            d = sum(shape.numel() for shape in self._shapes.values())
            self.buffer = torch.empty(batch, d, dtype=like.dtype, device=like.device)  # (B, d)
            self._views = {}
        if batch not in self._views:
            widths = [shape.numel() for shape in self._shapes.values()]
            blocks = torch.split(self.buffer[:batch], widths, dim=1)  # (B, d_i) each
            self._views[batch] = {
                n: block.view(batch, *shape)
                for (n, shape), block in zip(self._shapes.items(), blocks, strict=True)
            }
        return self._views[batch]
