"""A CPU stand-in for ``torch.cuda.set_sync_debug_mode("error")``: CI has no GPU, so the
operators that make the host wait for a CUDA device are refused by name.

:class:`SyncGuard` is a ``TorchDispatchMode``: it sees every aten operator a block of code runs
(autograd's backward and ``torch.func`` transforms included) and raises :class:`HostSyncError`
on those that synchronize on CUDA:

* a read of a tensor's value on the host (``.item()``, ``bool(t)``, ``if t:``, ``int(t)``);
* operators whose output size depends on the data (``nonzero``, ``masked_select``, ``unique``,
  ``bincount``, ``repeat_interleave`` without ``output_size``), and so boolean-mask indexing,
  reads and writes;
* an indexed write (``t[index] = value``, ``index_put_``) whose value is a host value (a Python
  number or ``torch.tensor(...)``): on CUDA ``index_put_`` copies it to the device and waits.

It cannot see what a CPU cannot tell apart: a copy to the host (``.cpu()``, ``.tolist()``) is a
no-op on the CPU, and a tensor that lives on the host on every device (an optimizer's step
count, a counter the CPU checks at once by design) would look like a device value; name those in
``host_tensors``. The ``gpu`` tests keep the real check.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

aten = torch.ops.aten

#: operators that always make the host wait: a value read, or an output sized by the data
SYNCING = {
    aten._local_scalar_dense,
    aten.is_nonzero,
    aten.equal,
    aten.nonzero,
    aten.masked_select,
    aten._unique,
    aten._unique2,
    aten.unique_dim,
    aten.unique_consecutive,
    aten.bincount,
}
INDEXED_WRITES = {aten.index_put_, aten.index_put, aten._index_put_impl_}
INDEXING = {aten.index, *INDEXED_WRITES}
MASK_DTYPES = (torch.bool, torch.uint8)


class HostSyncError(RuntimeError):
    """An operator that would synchronize the host with a CUDA device."""


class SyncGuard(TorchDispatchMode):
    """Refuse, inside the ``with`` block, every operator that would synchronize on CUDA.

    Args:
        host_tensors: tensors that live on the host on every device and may be read there.
    """

    def __init__(self, host_tensors: Iterable[torch.Tensor] = ()) -> None:
        super().__init__()
        self._host = WeakIdKeyDictionary({t: True for t in host_tensors})
        self._lifted = WeakIdKeyDictionary()  # host values turned into tensors in the block

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        reason = self._sync_reason(func, args, kwargs)
        if reason is not None:
            raise HostSyncError(f"{func}: {reason} (this synchronizes on CUDA)")
        out = func(*args, **kwargs)
        if func.overloadpacket is aten.lift_fresh:
            self._lifted[out] = True
        return out

    def _sync_reason(self, func: Any, args: tuple, kwargs: dict) -> str | None:
        """Why ``func(*args, **kwargs)`` would wait for the device, or ``None``."""
        packet = func.overloadpacket
        if packet in SYNCING:
            if packet is aten._local_scalar_dense and args[0] in self._host:
                return None
            return "a host read of a device value, or an output sized by the data"
        if packet is aten.repeat_interleave and kwargs.get("output_size") is None:
            return "repeat_interleave without output_size sizes its output by the data"
        if packet in INDEXING and _has_mask(args[1]):
            return "boolean-mask indexing sizes its work by the data"
        if packet in INDEXED_WRITES and _value(args, kwargs) in self._lifted:
            return "an indexed write of a host value copies it to the device"
        return None


def _has_mask(indices: Iterable[torch.Tensor | None]) -> bool:
    return any(i is not None and i.dtype in MASK_DTYPES for i in indices)


def _value(args: tuple, kwargs: dict) -> torch.Tensor:
    """The ``values`` argument of an ``index_put`` overload."""
    return args[2] if len(args) > 2 else kwargs["values"]


class HostCopyGuard(TorchDispatchMode):
    """Refuse, inside the ``with`` block, every copy of a host tensor into a device tensor.

    On CUDA such a copy from pageable memory blocks the host, and sync-debug mode refuses it; on
    the CPU, where every tensor is a host tensor, :class:`SyncGuard` cannot tell it apart. Run
    the code under test on the ``meta`` device instead (shapes without data: most operators
    run): a host value that reaches it shows as a copy from ``cpu`` to ``meta``.
    """

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func.overloadpacket
        if packet is aten._to_copy:
            source, target = args[0], kwargs.get("device")
        elif packet in (aten.copy_, aten._copy_from):
            source, target = args[1], args[0].device
        else:
            source = target = None
        if (
            isinstance(source, torch.Tensor)
            and source.device.type == "cpu"
            and target is not None
            and torch.device(target).type != "cpu"
        ):
            raise HostSyncError(f"{func}: a copy of a host tensor to {target} (blocks on CUDA)")
        return func(*args, **kwargs)
