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
        #: the layout: per trainable parameter, (name, the parameter object's id, its shape)
        self._layout: list[tuple[str, int, torch.Size]] = []
        self._views: dict[int, Grads] = {}  # B -> name -> (B, *shape) views of the buffer

    def views(self, batch: int, params: dict[str, nn.Parameter], tensors: list[torch.Tensor]):
        """Name -> ``(B, *shape)`` column blocks of the buffer (``{}``: write fresh tensors).

        Args:
            batch: ``B``.
            params: The trainable parameters by name, in ``named_parameters`` order: the layout
                is keyed by the parameter objects and their shapes, so a replaced or resized
                parameter gets a new one.
            tensors: The layers' inputs and output gradients: the buffer takes their dtype and
                device; when they mix dtypes or devices (or there are none), ``{}``.
        """
        if not tensors:
            return {}
        like = tensors[0]
        if any(t.dtype != like.dtype or t.device != like.device for t in tensors):
            return {}
        layout = [(n, id(p), p.shape) for n, p in params.items()]
        if layout != self._layout:  # first call, or parameters were (un)frozen or replaced
            self._layout, self.buffer = layout, None
        buffer = self.buffer
        small = buffer is None or len(buffer) < batch
        if small or buffer.dtype != like.dtype or buffer.device != like.device:
            d = sum(shape.numel() for _, _, shape in layout)
            self.buffer = torch.empty(batch, d, dtype=like.dtype, device=like.device)  # (B, d)
            self._views = {}
        if batch not in self._views:
            widths = [shape.numel() for _, _, shape in layout]
            blocks = torch.split(self.buffer[:batch], widths, dim=1)  # (B, d_i) each
            self._views[batch] = {
                n: block.view(batch, *shape)
                for (n, _, shape), block in zip(layout, blocks, strict=True)
            }
        return self._views[batch]
