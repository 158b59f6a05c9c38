"""step() never synchronizes the host with the device, for any ordering or kernel."""

from __future__ import annotations

import pytest
import torch
from helpers import ALL_ORDERINGS, KERNELS, make

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("name", ALL_ORDERINGS)
def test_step_is_sync_free_on_cuda(name, kernel, normalize):
    n, d, b = 70, 33, 8  # b does not divide n: the last step is a short one
    bal = make(name, n, d, batch_size=b, depth=3, kernel=kernel, normalize=normalize,
               device="cuda")  # fmt: skip
    g = torch.Generator(device="cuda").manual_seed(0)
    z = torch.randn(n, d, device="cuda", generator=g)
    for epoch in range(2):
        order = bal.order.clone()
        batches = [z[order[s : s + b]] for s in range(0, n, b)]  # indexing happens outside
        dicts = [{"w": x[:, :30].reshape(-1, 5, 6), "b": x[:, 30:]} for x in batches]
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for i, x in enumerate(batches):
                bal.step(dicts[i] if epoch == 1 else x)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        bal.set_epoch(epoch + 1)
        assert sorted(bal.order.tolist()) == list(range(n))
