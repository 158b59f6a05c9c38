"""A model that re-indexes its batch by data (``h[sel]`` before a head): the hook path's probe
infers the head's batch axis from one batch's shapes, which a later batch can break with the
same shapes (as many items as examples, but two from one example and none from another). Such a
plan is checked in full on every call (issue 49, items 4 and 6): a call whose items still match
its examples one to one is right, the first that does not is refused, ``p.grad`` untouched."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from grab_exp.per_sample import UnsupportedModelError, make_per_sample

F64 = torch.float64
B, T, D = 4, 5, 3


class SelectedHead(nn.Module):
    """A head on the items of ``x`` whose first feature is positive: ``(n_sel, classes)``."""

    def __init__(self) -> None:
        super().__init__()
        self.enc, self.head = nn.Linear(D, 6), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.enc(x))  # (B, T, 6)
        return self.head(h[x[..., 0] > 0])  # (n_sel, 3)


def batch(positions: list[tuple[int, int]], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Items at ``positions`` (example, step) selected; the rest not."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(B, T, D, generator=g, dtype=F64) + 0.1
    x[..., 0] = -x[..., 0]
    for i, t in positions:
        x[i, t, 0] = -x[i, t, 0]
    return x, torch.randint(0, 3, (B,), generator=g)


def example_rows(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict:
    named = [(n, p) for n, p in model.named_parameters()]
    rows: dict[str, list] = {n: [] for n, _ in named}
    for i in range(B):
        out = model(x[i : i + 1])
        loss = F.cross_entropy(out, y[i : i + len(out)]) if len(out) else out.sum()
        grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
        for (n, p), g in zip(named, grads, strict=True):
            rows[n].append(torch.zeros_like(p) if g is None else g)
    return {n: torch.stack(r) for n, r in rows.items()}


ONE_EACH = [(i, (i + k) % T) for i in range(B) for k in range(1)]
UNEVEN = [(0, 0), (0, 1), (2, 2), (3, 3)]  # B items, none of example 1


@pytest.mark.parametrize("method", ["hooks", "factored", "auto"])
def test_a_later_batch_that_breaks_the_inferred_axis_is_refused(method: str) -> None:
    torch.manual_seed(0)
    model = SelectedHead().double()
    psg = make_per_sample(model, F.cross_entropy, method)
    for call in range(6):  # calls 1, 2, 4 are on the schedule; 3, 5 and 6 are not
        x, y = batch([(i, (i + call) % T) for i in range(B)], seed=call)
        model.zero_grad(set_to_none=True)
        loss, grads = psg(x, y)
        want = example_rows(model, x, y)
        torch.testing.assert_close(loss, F.cross_entropy(model(x), y).detach())
        for n, rows in grads.as_dict().items():
            torch.testing.assert_close(rows, want[n], msg=f"call {call}: rows of {n}")
    x, y = batch(UNEVEN, seed=9)
    model.zero_grad(set_to_none=True)
    with pytest.raises(UnsupportedModelError, match="re-indexes its batch") as error:
        psg(x, y)
    assert "\n" not in str(error.value)
    assert all(p.grad is None for p in model.parameters())


class TakenApart(nn.Module):
    """Sorts its batch by the first input feature, runs a layer, and puts the examples back in
    Python (``how``: ``select``, ``h[j]`` each and ``stack``; ``unbind``; ``split`` and ``cat``),
    or reorders them by the data with ``flip`` (under ``torch.where``), ``roll`` or a permutation
    ``matrix`` and back (adversarial review 4), the permutation put back by
    ``addmm`` (round 16), or puts the output back with ``einsum`` and a
    one-hot matrix, the matrix on the right (``(out.T @ P).T``) or ``F.embedding`` of the output
    (adversarial review 5): the graph is the same whatever the order, so a call whose order
    differs from the checked ones' is no new kind of batch."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.a, self.b, self.how = nn.Linear(6, 8), nn.Linear(8, 3), how

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 6) -> (B, 3)
        if self.how == "flip":
            c = x[0, 0] > x[-1, 0]
            h = torch.tanh(self.a(torch.where(c, x.flip(0), x)))
            return self.b(torch.where(c, h.flip(0), h))
        if self.how == "roll":
            k = int(x[:, 0].argmin())
            return self.b(torch.roll(torch.tanh(self.a(torch.roll(x, -k, 0))), k, 0))
        if self.how in ("matrix", "addmm"):
            permutation = torch.eye(len(x), dtype=x.dtype)[x[:, 0].argsort()]  # (B, B)
            h = torch.tanh(self.a(permutation @ x))  # (B, 8), sorted
            if self.how == "addmm":  # back with a (B, 8) term added: one addmm node, not mm
                return self.b(torch.addmm(torch.zeros_like(h), permutation.T, h))
            return self.b(permutation.T @ h)
        order = x[:, 0].argsort()
        if self.how in ("einsum", "matrix_right", "embedding"):  # back after the last layer
            out = self.b(torch.tanh(self.a(x[order])))  # (B, 3), sorted
            one_hot = F.one_hot(order, len(x)).to(x.dtype)  # (B, B)
            if self.how == "einsum":
                return torch.einsum("ji,jc->ic", one_hot, out)
            if self.how == "matrix_right":
                return (out.T @ one_hot).T
            return F.embedding(order.argsort(), out)  # out's rows taken by index
        h = torch.tanh(self.a(x[order]))  # x needs no grad: no node for this re-indexing
        back = order.argsort().tolist()
        if self.how == "select":
            h = torch.stack([h[j] for j in back])
        elif self.how == "unbind":
            pieces = h.unbind(0)
            h = torch.stack([pieces[j] for j in back])
        else:
            pieces = h.split(1)
            h = torch.cat([pieces[j] for j in back])
        return self.b(h)


@pytest.mark.parametrize(
    "how",
    [
        "select",
        "unbind",
        "split",
        "flip",
        "roll",
        "matrix",
        "addmm",
        "einsum",
        "matrix_right",
        "embedding",
    ],
)
@pytest.mark.parametrize("method", ["hooks", "factored", "auto"])
def test_a_batch_taken_apart_and_put_back_by_data_is_checked_every_call(how, method) -> None:
    """Batches already in order on the schedule's calls (1, 2 and 4), in reverse on call 3: the
    hook path checks every call of a model that takes its batch apart along the batch axis,
    and refuses call 3 (its rows would belong to other examples); ``auto`` then takes func."""
    torch.manual_seed(0)
    model = TakenApart(how).double()
    psg = make_per_sample(model, F.cross_entropy, method)
    g = torch.Generator().manual_seed(1)
    for call in range(4):
        x = torch.randn(B, 6, generator=g, dtype=F64)
        x = x[x[:, 0].argsort(descending=call == 2)]
        y = torch.randint(0, 3, (B,), generator=g)
        model.zero_grad(set_to_none=True)
        if call == 2 and method != "auto":
            with pytest.raises(UnsupportedModelError, match="re-indexes its batch") as error:
                psg(x, y)
            assert "\n" not in str(error.value)
            assert all(p.grad is None for p in model.parameters())
            return
        _, grads = psg(x, y)
        want = example_rows(model, x, y)
        for n, rows in grads.as_dict().items():
            torch.testing.assert_close(rows, want[n], msg=f"call {call}: rows of {n}")


class FirstToken(nn.Module):
    """A head on each example's first item, ``h[:, 0]``: an axis of ``T`` items taken apart."""

    def __init__(self) -> None:
        super().__init__()
        self.enc, self.head = nn.Linear(D, 6), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, 3)
        return self.head(torch.tanh(self.enc(x))[:, 0])


@pytest.mark.parametrize("batch", [1, 4, T])
def test_another_axis_taken_apart_is_checked_every_call_only_at_its_length(batch: int) -> None:
    """``h[:, 0]`` takes apart the item axis, not the batch: no full check per call, except at a
    batch as long as that axis (the price of not knowing which axis is the batch's)."""
    psg = make_per_sample(FirstToken().double(), F.cross_entropy, "hooks")
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        psg(torch.randn(batch, T, D, generator=g, dtype=F64), torch.randint(0, 3, (batch,)))
    assert psg.planner.plan.reindexes == (batch == T)


class LastAxes(nn.Module):
    """Items taken from, flipped and rolled along the last axes (negative dimensions, which
    torch's graph saves as unsigned integers): none of them is the batch's."""

    def __init__(self) -> None:
        super().__init__()
        self.enc, self.head = nn.Linear(D, 6), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, 3)
        h = torch.tanh(self.enc(x)).flip(-1)  # (B, T, 6)
        h = torch.roll(h, 1, -2)[:, -1] + h.unbind(-2)[0] + h.select(-2, 1)  # (B, 6)
        return self.head(h + h[..., -1:])


def test_negative_axes_are_not_the_batch() -> None:
    torch.manual_seed(0)
    model = LastAxes().double()
    psg = make_per_sample(model, F.cross_entropy, "hooks")
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        x, y = torch.randn(4, T, D, generator=g, dtype=F64), torch.randint(0, 3, (4,), generator=g)
        _, grads = psg(x, y)
        want = example_rows(model, x, y)
        for n, rows in grads.as_dict().items():
            torch.testing.assert_close(rows, want[n], msg=n)
    assert not psg.planner.plan.reindexes


@pytest.mark.parametrize("bias", [False, True])
def test_a_square_weight_as_wide_as_the_batch_is_not_a_permutation(bias: bool) -> None:
    """``F.linear`` of a ``(B, B)`` input with a ``(B, B)`` weight: without a bias one matrix
    product with a ``(B, B)`` operand on each side, one of them a parameter's (a layer's weight,
    not a permutation built from the data): no full check on every call (before: one on every
    call, and the re-indexing named beside any refusal)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(B, B, bias=bias), nn.Tanh(), nn.Linear(B, 3)).double()
    psg = make_per_sample(model, F.cross_entropy, "hooks")
    g = torch.Generator().manual_seed(0)
    for _ in range(6):
        x, y = torch.randn(B, B, generator=g, dtype=F64), torch.randint(0, 3, (B,), generator=g)
        _, grads = psg(x, y)
        want = example_rows(model, x, y)
        for n, rows in grads.as_dict().items():
            torch.testing.assert_close(rows, want[n], msg=n)
    assert not psg.planner.plan.reindexes
    assert psg.checker.checks < 6  # calls 1, 2 and 4
