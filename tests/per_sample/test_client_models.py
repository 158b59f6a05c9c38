"""The models users bring, through ``method="auto"`` (and each explicit method): per-sample
gradients equal a per-example loop written here, or the model is refused in one line naming the
layer. None is silently wrong: the T == B layouts, whose shapes fit a wrong rule, included."""

from __future__ import annotations

import contextlib
import copy
import importlib.util

import pytest
import torch
from support.client_models import (
    GRUClassifier,
    PositionModel,
    SequenceFirst,
    TransformerClassifier,
    WordLM,
    sequence_case,
    tiny_bert,
)
from support.plain_step import assert_a_plain_step_from_one_seed
from torch import nn
from torch.nn import functional as F

from grab_exp.bench.per_sample import resnet18_gn
from grab_exp.per_sample import (
    FuncPerSample,
    HookedPerSample,
    UnsupportedModelError,
    batchnorm_to_groupnorm,
    make_per_sample,
)

ATOL, RTOL = 1e-11, 1e-10  # float64
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


def per_example_loop(model: nn.Module, x: torch.Tensor, y: torch.Tensor, masks=None) -> dict:
    """Reference ``name -> (B, *shape)``: one ``backward()`` per example, through the whole
    model; with ``masks`` (Dropout module name -> the batch's ``(B, ...)`` masks), each Dropout
    applies example ``b``'s mask instead of drawing one."""
    rows: dict[str, list[torch.Tensor]] = {n: [] for n, p in model.named_parameters()}
    for b in range(len(x)):
        hooks = []
        for name, module in model.named_modules():
            if masks is not None and name in masks:
                mask = masks[name][b : b + 1]
                hooks.append(module.register_forward_hook(lambda m, a, o, mask=mask: a[0] * mask))
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[b : b + 1]), y[b : b + 1]).backward()
        for hook in hooks:
            hook.remove()
        for name, g in rows.items():
            grad = model.get_parameter(name).grad
            g.append(torch.zeros_like(model.get_parameter(name)) if grad is None else grad.clone())
    model.zero_grad(set_to_none=True)
    return {name: torch.stack(g) for name, g in rows.items()}


def assert_matches(grads, expected: dict) -> None:
    got = grads.as_dict()
    assert list(got) == list(expected)
    for name, want in expected.items():
        torch.testing.assert_close(got[name], want, atol=ATOL, rtol=RTOL, msg=name)


SEQUENCE_MODELS = {
    "lstm_lm": lambda seq: WordLM("LSTM"),
    "lstm_lm_seq_first": lambda seq: WordLM("LSTM", batch_first=False),
    "gru_lm": lambda seq: WordLM("GRU", layers=1),
    "rnn_tanh": lambda seq: WordLM("RNN"),
    "gru_classifier": lambda seq: GRUClassifier(),
    "transformer": lambda seq: TransformerClassifier(seq=seq),
    "transformer_seq_first": lambda seq: TransformerClassifier(batch_first=False, seq=seq),
    "position_embedding": PositionModel,
    "sequence_first": lambda seq: SequenceFirst(),
}
if HAS_TRANSFORMERS:
    SEQUENCE_MODELS["tiny_bert"] = tiny_bert


@pytest.mark.parametrize(("batch", "seq"), [(6, 6), (6, 5)], ids=["T==B", "T!=B"])
@pytest.mark.parametrize("name", sorted(SEQUENCE_MODELS))
def test_auto_equals_the_per_example_loop(name, batch, seq):
    model, x, y = sequence_case(lambda: SEQUENCE_MODELS[name](seq), batch, seq)
    expected = per_example_loop(model, x, y)
    psg = make_per_sample(model, F.cross_entropy)
    loss, grads = psg(x, y)
    assert psg.method in ("hooks", "factored")  # not func: the hook path covers them all
    assert_matches(grads, expected)
    torch.testing.assert_close(loss, F.cross_entropy(model(x), y).detach(), atol=1e-12, rtol=0)
    for pname, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[pname].mean(0), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize(("batch", "seq"), [(6, 6), (6, 5)], ids=["T==B", "T!=B"])
@pytest.mark.parametrize("make", [PositionModel, lambda seq: SequenceFirst()])
@pytest.mark.parametrize("method", ["hooks", "factored", "func"])
def test_every_method_gets_position_embeddings_and_sequence_first_layers_right(
    make, method, batch, seq
):
    model, x, y = sequence_case(lambda: make(seq), batch, seq)
    expected = per_example_loop(model, x, y)
    _, grads = make_per_sample(model, F.cross_entropy, method)(x, y)
    assert_matches(grads, expected)


def test_the_position_embeddings_input_is_expanded_and_the_layouts_say_where_the_batch_is():
    model, x, y = sequence_case(lambda: SequenceFirst(), 6, 6)
    hooked = HookedPerSample(model, F.cross_entropy)
    hooked(x, y)
    layouts = hooked.planner.plan.layouts
    assert layouts["mix"][0].inputs == (1,) and layouts["mix"][0].outputs == (1,)
    assert layouts["tok"][0].inputs == (0,)
    model, x, y = sequence_case(lambda: PositionModel(6), 6, 6)
    hooked = HookedPerSample(model, F.cross_entropy)
    hooked(x, y)
    assert hooked.planner.plan.expanded == {"pos"}


def test_rnns_and_attention_take_their_per_layer_paths():
    model, x, y = sequence_case(GRUClassifier, 4, 5)
    hooked = HookedPerSample(model, F.cross_entropy)
    hooked(x, y)
    assert hooked.registry.fallbacks["gru"].batched_by == "loop"  # torch's vmap cannot batch nn.GRU
    model, x, y = sequence_case(lambda: TransformerClassifier(seq=5), 4, 5)
    hooked = HookedPerSample(model, F.cross_entropy)
    hooked(x, y)
    attention = "encoder.layers.0.self_attn"
    assert hooked.registry.fallbacks[attention].adopted == ["out_proj.weight", "out_proj.bias"]
    assert "encoder.layers.0.linear1" in hooked.registry.rules


class ReshapedPosition(PositionModel):
    """A position embedding whose output the forward reshapes to ``(T, D)``: with its input
    expanded over the batch, that reshape fails."""

    def forward(self, tokens):
        seq = tokens.shape[1]
        h = self.tok(tokens) + self.pos(torch.arange(seq)).view(seq, -1)  # (B, T, 6)
        return self.head(torch.tanh(h).mean(1))


def test_a_forward_that_the_expansion_breaks_is_refused_by_layer_and_auto_takes_func():
    model, x, y = sequence_case(lambda: ReshapedPosition(5), 4, 5)
    with pytest.raises(UnsupportedModelError, match=r"^pos \(Embedding\): its input has no batch"):
        HookedPerSample(model, F.cross_entropy)(x, y)
    model, x, y = sequence_case(lambda: ReshapedPosition(5), 4, 5)
    expected = per_example_loop(model, x, y)
    psg = make_per_sample(model, F.cross_entropy)
    _, grads = psg(x, y)
    assert psg.method == "func"
    assert_matches(grads, expected)


class AssertedPosition(PositionModel):
    """A position embedding whose output the forward requires to be ``(T, D)`` by an error without
    a message (a bare ``assert``, outside pytest's rewriting), which its input expanded over the
    batch raises."""

    def forward(self, tokens):
        positions = self.pos(torch.arange(tokens.shape[1]))
        if positions.dim() != 2:
            raise AssertionError
        return self.head(torch.tanh(self.tok(tokens) + positions).mean(1))


def test_a_probe_failure_without_a_message_is_refused_naming_the_layer():
    """An error without a message in the probe's forward (a bare ``assert``): refused naming the
    layer (the refusal's first line of the error had raised an IndexError)."""
    model, x, y = sequence_case(lambda: AssertedPosition(5), 4, 5)
    with pytest.raises(UnsupportedModelError, match=r"^pos \(Embedding\): its input has no batch"):
        HookedPerSample(model, F.cross_entropy)(x, y)


def test_func_on_a_gru_is_refused_naming_the_layer():
    model, x, y = sequence_case(GRUClassifier, 4, 5)
    with pytest.raises(UnsupportedModelError, match=r"at gru \(GRU\), which it cannot batch"):
        make_per_sample(model, F.cross_entropy, "func")(x, y)


def test_dropout_modules_in_training_mode_give_the_batchs_masks_own_gradients():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.4), nn.Linear(16, 16), nn.Tanh(),
        nn.Dropout(0.2), nn.Linear(16, 3),
    ).double()  # fmt: skip
    x, y = torch.randn(8, 6, dtype=torch.float64), torch.arange(8) % 3
    masks = {}

    def drawing(name, module):
        def forward(inp):  # the draw Dropout makes, as its scaled mask
            masks[name] = F.dropout(torch.ones_like(inp), module.p, training=True)
            return inp * masks[name]

        return forward

    psg = make_per_sample(model, F.cross_entropy)  # auto: no randomness needed
    state = torch.get_rng_state()
    _, grads = psg(x, y)
    torch.set_rng_state(state)  # the same draws again, made visible as masks
    for i in (2, 5):
        model[i].forward = drawing(str(i), model[i])
    model(x)
    for i in (2, 5):
        del model[i].forward
    assert psg.method == "factored"
    assert_matches(grads, per_example_loop(model, x, y, masks))


def test_dropout_inside_a_replayed_layer_is_refused_and_auto_takes_func():
    model, x, y = sequence_case(lambda: TransformerClassifier(dropout=0.1, seq=5), 4, 5)
    with pytest.raises(
        UnsupportedModelError, match=r"^encoder\.layers\.0\.self_attn \(MultiheadAttention\) draws"
    ):
        HookedPerSample(model, F.cross_entropy)(x, y)
    psg = make_per_sample(model, F.cross_entropy)
    loss, grads = psg(x, y)
    assert psg.method == "func" and psg.chosen.randomness == "different"
    assert torch.isfinite(grads.dense().matrix).all() and torch.isfinite(loss)
    mean = grads.as_dict()["head.weight"].mean(0)
    torch.testing.assert_close(model.head.weight.grad, mean, atol=1e-12, rtol=1e-10)


def test_auto_accepts_randomness():
    model, x, y = sequence_case(lambda: TransformerClassifier(seq=5), 4, 5)
    psg = make_per_sample(model, F.cross_entropy, randomness="same")
    psg(x, y)
    assert psg.method in ("hooks", "factored")
    with pytest.raises(ValueError, match=r"randomness='same' needs method=func or auto"):
        make_per_sample(model, F.cross_entropy, "hooks", randomness="same")


@pytest.mark.parametrize("method", ["auto", "hooks", "factored", "func"])
def test_a_sum_reduced_loss_is_refused_on_every_method(method):
    model, x, y = sequence_case(lambda: SequenceFirst(), 4, 5)

    def summed(logits, labels):
        return F.cross_entropy(logits, labels, reduction="sum")

    with pytest.raises(UnsupportedModelError, match=r"^loss_fn gave .* \(it is their SUM\)"):
        make_per_sample(model, summed, method)(x, y)
    assert all(p.grad is None for p in model.parameters())  # refused before any work


def test_a_loss_without_reduction_is_refused():
    model, x, y = sequence_case(lambda: SequenceFirst(), 4, 5)

    def unreduced(logits, labels):
        return F.cross_entropy(logits, labels, reduction="none")

    with pytest.raises(UnsupportedModelError, match=r"^loss_fn returned \(\d+,\), not a scalar"):
        make_per_sample(model, unreduced)(x, y)


@pytest.mark.slow
def test_a_torchvision_resnet18_with_groupnorm_equals_the_loop():
    torch.manual_seed(0)
    model = resnet18_gn().double()
    x, y = torch.randn(3, 3, 16, 16, dtype=torch.float64), torch.tensor([0, 1, 2])
    expected = per_example_loop(model, x, y)
    psg = make_per_sample(model, F.cross_entropy)
    _, grads = psg(x, y)
    assert psg.method in ("hooks", "factored")
    assert_matches(grads, expected)


def test_batchnorm_is_refused_naming_the_helper_and_the_helper_makes_the_model_work():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 12, 3), nn.BatchNorm2d(12), nn.ReLU(), nn.Flatten(), nn.LazyLinear(3)
    ).double()
    x, y = torch.randn(4, 3, 8, 8, dtype=torch.float64), torch.tensor([0, 1, 2, 0])
    model(x)
    for method in ("auto", "hooks", "func"):
        with pytest.raises(ValueError, match=r"^1 \(BatchNorm2d\) .*batchnorm_to_groupnorm"):
            make_per_sample(model, F.cross_entropy, method)
    assert batchnorm_to_groupnorm(model) is model
    assert isinstance(model[1], nn.GroupNorm) and model[1].num_groups == 4  # gcd(12, 32)
    expected = per_example_loop(model, x, y)
    _, grads = make_per_sample(model, F.cross_entropy)(x, y)
    assert_matches(grads, expected)


@pytest.mark.parametrize("channels", [3, 8, 64])
def test_batchnorm1d_on_vectors_becomes_a_groupnorm_that_depends_on_its_input(channels: int):
    """Issue 49: ``BatchNorm1d(C)`` over ``(B, C)`` became ``GroupNorm(C, C)``, one value per
    group, normalized to 0: the layer output its bias for any input. Then groups of two channels,
    whose normalization is their sign: its Jacobian at an input was about 1e-5 (the rows of a
    layer before it rounding, refused at 3e-4 in float32: round 38). Now ``GroupNorm(1, C)``, whose
    Jacobian has rank C - 2 (the mean and the scale taken out); one or two channels are refused
    by name, and a refusal leaves the model as it was."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, channels), nn.BatchNorm1d(channels), nn.Linear(channels, 3))
    batchnorm_to_groupnorm(model.double())
    assert model[1].num_groups == 1
    h = torch.randn(channels, dtype=torch.float64)
    jacobian = torch.autograd.functional.jacobian(lambda v: model[1](v[None])[0], h)  # (C, C)
    assert torch.linalg.matrix_rank(jacobian, atol=1e-3) == channels - 2
    x, y = torch.randn(4, 5, dtype=torch.float64), torch.tensor([0, 1, 2, 0])
    expected = per_example_loop(model, x, y)
    assert_matches(make_per_sample(model, F.cross_entropy)(x, y)[1], expected)
    for few in (1, 2):
        kept = nn.Sequential(nn.BatchNorm2d(4), nn.Linear(5, few), nn.BatchNorm1d(few))
        with pytest.raises(
            ValueError, match=rf"^batchnorm_to_groupnorm: 2 \(BatchNorm1d\) has {few} channel"
        ):
            batchnorm_to_groupnorm(kept)
        assert isinstance(kept[0], nn.BatchNorm2d), "a refusal replaced a layer"


def test_batchnorm1d_becomes_a_groupnorm_whose_rows_are_right_in_float32():
    """Round 38: after batchnorm_to_groupnorm, the factored path refused a BatchNorm1d's
    model at every width from 4 to 16 channels as rows that are not the examples' (relative
    difference 1.5e-4 to 3.4e-4): two-channel groups, whose gradient is rounding. Every call of
    every method is right now (float32, against a float64 loop)."""
    torch.manual_seed(0)
    for method in ("auto", "hooks", "factored", "func", "loop"):
        model = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
        batchnorm_to_groupnorm(model)
        psg = make_per_sample(model, F.cross_entropy, method=method)
        g = torch.Generator().manual_seed(1)
        for size in (3, 1, 7, 2, 12):
            x, y = torch.randn(size, 6, generator=g), torch.randint(0, 3, (size,), generator=g)
            expected = per_example_loop(copy.deepcopy(model).double(), x.double(), y)
            _, grads = psg(x, y)
            for name, rows in grads.as_dict().items():
                torch.testing.assert_close(rows.double(), expected[name], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("method", ["func", "auto"])
def test_the_check_leaves_no_trace(method):
    """The check restores param.grad and the random generator: a checked call gives what it
    gives without the check."""
    results = []
    options = {"randomness": "different"} if method == "func" else {}
    for check_every in (64, 0):
        model, x, y = sequence_case(lambda: TransformerClassifier(dropout=0.1, seq=5), 4, 5)
        model.head.weight.grad = torch.ones_like(model.head.weight)
        psg = make_per_sample(model, F.cross_entropy, method, check_every=check_every, **options)
        torch.manual_seed(5)
        _, grads = psg(x, y)
        results.append((torch.rand(1), model.head.weight.grad.clone(), grads.dense().matrix))
    for checked, unchecked in zip(*results, strict=True):
        assert torch.equal(checked, unchecked)


def test_a_user_forward_outside_the_path_is_a_plain_forward():
    """Hooks are idle outside psg's own forward: an expanded layer is not expanded there."""
    model, x, y = sequence_case(lambda: PositionModel(5), 4, 5)
    psg = make_per_sample(model, F.cross_entropy, "hooks")
    psg(x, y)
    assert model(x[:1]).shape == (1, 3)
    assert isinstance(psg, HookedPerSample) and not isinstance(psg, FuncPerSample)


class PositionAndClass(nn.Module):
    """:class:`PositionModel` (the position embedding called by keyword or not), a class token
    ``Embedding(1, D)`` of ``tensor([0])`` expanded over the batch (its dimension 0 is the
    batch's: right on the hook path at every ``T``)."""

    def __init__(self, keyword: bool, seq: int = 6) -> None:
        super().__init__()
        self.tok, self.pos, self.cls = nn.Embedding(9, 6), nn.Embedding(seq, 6), nn.Embedding(1, 6)
        self.head, self.keyword = nn.Linear(6, 4), keyword

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1])  # (T,)
        h = self.tok(tokens) + (self.pos(input=positions) if self.keyword else self.pos(positions))
        cls = self.cls(torch.tensor([0])).expand(len(tokens), -1)  # (B, 6)
        return self.head(torch.tanh(h).mean(1) + cls)


def refused_on_the_hook_path(model, method, shapes, refused, pattern, check_every=0) -> None:
    """Calls of token batches ``(batch, T)`` in ``shapes`` on one ``psg``: on the hook path
    those where ``refused(T)`` raise ``pattern``, every other call equals the per-example loop;
    ``auto`` is right on each, and ends on ``func``."""
    psg = make_per_sample(model, F.cross_entropy, method, check_every=check_every)
    for batch, seq in shapes:
        x, y = torch.randint(0, 9, (batch, seq)), torch.randint(0, 4, (batch,))
        if refused(seq) and method != "auto":
            with pytest.raises(UnsupportedModelError, match=pattern):
                psg(x, y)
            continue
        assert_matches(psg(x, y)[1], per_example_loop(model, x, y))
        model.zero_grad(set_to_none=True)
    assert method != "auto" or psg.method == "func"


@pytest.mark.parametrize("keyword", [False, True], ids=["positional", "keyword"])
@pytest.mark.parametrize("method", ["hooks", "factored", "auto"])
def test_a_position_embedding_broadcast_at_one_token_is_refused_on_the_hook_path(method, keyword):
    """At ``T = 1`` the position input ``(1,)`` expanded over the batch gives ``(B, D)``, which
    ``(B, 1, D) + (B, D)`` broadcasts to ``(B, B, D)``: every example's output reads every
    example's position row. Even with the check off the probe refuses it, naming ``pos``; at
    ``T >= 2`` (keyword call included) the hook path is right, and ``auto`` is right at every T."""
    torch.manual_seed(0)
    model, shapes = PositionAndClass(keyword).double(), [(5, 4), (3, 1), (4, 3), (1, 1), (6, 1)]
    pattern = r"^pos \(Embedding\): .*broadcast"
    refused_on_the_hook_path(model, method, shapes, lambda seq: seq == 1, pattern)


class QueryPool(nn.Module):
    """Attention pooling with one learned query ``Embedding(1, D)`` of ``zeros(1)``: given the
    batch, its ``(B, D)`` output times the keys ``(B, D, T)`` broadcasts to ``(B, B, T)`` and
    ``[:, 0]`` reads copy 0's query for every example (round 15)."""

    def __init__(self) -> None:
        super().__init__()
        self.tok, self.query = nn.Embedding(9, 6), nn.Embedding(1, 6)
        self.key, self.head = nn.Linear(6, 6), nn.Linear(6, 4)

    def forward(self, tokens):
        h = self.tok(tokens)  # (B, T, 6)
        q = self.query(torch.zeros(1, dtype=torch.long))  # (1, 6)
        weights = torch.softmax(q @ self.key(h).transpose(1, 2), -1)  # (B, 1, T)
        return self.head((weights @ h)[:, 0])


@pytest.mark.parametrize("method", ["hooks", "factored", "auto"])
def test_one_expanded_copy_read_for_every_example_is_refused_on_the_hook_path(method):
    """Every example's output reads the first copy of the expanded query: its rows went to
    example 0 alone, silently with the check off (the probe asked only whether the first copy's
    output reached the others'). Refused naming ``query`` with ``check_every=0``; ``auto`` right."""
    torch.manual_seed(0)
    model, pattern = QueryPool().double(), r"^query \(Embedding\): .* one copy"
    refused_on_the_hook_path(model, method, [(3, 4), (5, 2)], lambda seq: True, pattern)


class SharedWithPositions(nn.Module):
    """One Linear on the examples' activations ``(B, T, 6)`` and on the position table ``(T, 6)``
    alone (round 14's case 31)."""

    def __init__(self) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(9, 6), nn.Embedding(8, 6)
        self.mix, self.head = nn.Linear(6, 6), nn.Linear(6, 4)

    def forward(self, tokens):
        positions = self.pos(torch.arange(tokens.shape[1]))  # (T, 6)
        h = self.mix(self.tok(tokens) + positions) + self.mix(positions)  # (B, T, 6)
        return self.head(torch.tanh(h).mean(1))


@pytest.mark.parametrize("method", ["hooks", "factored", "auto"])
def test_a_layer_called_with_and_without_the_batch_is_refused_naming_both_calls(method):
    """The hook path gives a layer's inputs the batch on all its calls or none: a layer called on
    both kinds in one forward is refused naming that (before: a layout message about a tensor of
    shape ``(2, 2, T, 6)``); ``auto`` takes ``func`` and is right."""
    torch.manual_seed(0)
    model, pattern = SharedWithPositions().double(), r"^mix \(Linear\) is called on "
    shapes = [(4, 3), (2, 1), (3, 4)]
    refused_on_the_hook_path(model, method, shapes, lambda seq: True, pattern, check_every=128)


class PenaltyBeside(nn.Module):
    """Logits and a scalar beside them, from a class token ``Embedding(1, 6)`` of ``tensor([0])``
    and a position embedding of ``arange(T)`` (rounds 16 and 17), as ``kind``: ``penalty`` on the
    class token (given the batch, a sum over its copies); ``first``, its first row (one copy
    read for all); ``normed``, positions scaled by a detached norm (over the copies, given the
    batch); ``batch_mean`` of the activations (right on the hook path). ``dropout`` on the tokens'
    embeddings (round 18)."""

    def __init__(self, kind: str, dropout: float = 0.0) -> None:
        super().__init__()
        self.tok, self.pos, self.cls = nn.Embedding(9, 6), nn.Embedding(8, 6), nn.Embedding(1, 6)
        self.head, self.kind, self.drop = nn.Linear(6, 4), kind, nn.Dropout(dropout)

    def forward(self, tokens):
        positions = self.pos(torch.arange(tokens.shape[1]))  # (T, 6)
        if self.kind == "normed":
            positions = positions / positions.detach().norm()
        h = torch.tanh(self.drop(self.tok(tokens)) + positions)  # (B, T, 6)
        cls = self.cls(torch.tensor([0]))  # (1, 6)
        aux = {
            "penalty": lambda: cls.pow(2).sum(),
            "first": lambda: cls[0].pow(2).sum(),
        }.get(self.kind, lambda: h.pow(2).mean() + 0 * cls.sum())()
        return self.head(h.mean(1) + cls), aux


def with_penalty(out, y):
    return F.cross_entropy(out[0], y) + out[1]


@pytest.mark.parametrize("kind", ["penalty", "first", "normed", "batch_mean"])
@pytest.mark.parametrize("method", ["hooks", "factored", "auto"])
def test_an_output_without_the_batch_that_copies_change_is_refused_on_the_hook_path(method, kind):
    """Given the batch, a penalty on the class token became a sum over its copies, its first row
    sent the penalty's gradient to example 0 alone, and a detached norm of the positions was
    taken over the copies: the loss (the norm's too), the rows or ``p.grad`` were off with
    ``check_every=0``, and with the check on the refusal blamed the loss or the mixing. Now the
    probe refuses each naming the layer; a batch mean beside the logits, which every copy
    reaches alike, stays right on the hook path; ``auto`` is right on all."""
    torch.manual_seed(0)
    model, refused = PenaltyBeside(kind).double(), kind != "batch_mean"
    psg = make_per_sample(model, with_penalty, method, check_every=0)
    for batch, seq in [(4, 3), (3, 2)]:
        x, y = torch.randint(0, 9, (batch, seq)), torch.randint(0, 4, (batch,))
        if refused and method != "auto":
            with pytest.raises(UnsupportedModelError, match=r"^(cls|pos) \(Embedding\): its "):
                psg(x, y)
            continue
        loss, grads = psg(x, y)
        torch.testing.assert_close(loss, with_penalty(model(x), y).detach())
        named = list(model.named_parameters())
        for i in range(batch):
            alone = with_penalty(model(x[i : i + 1]), y[i : i + 1])
            want = torch.autograd.grad(alone, [p for _, p in named], allow_unused=True)
            for (n, p), g in zip(named, want, strict=True):
                g = torch.zeros_like(p) if g is None else g
                torch.testing.assert_close(grads.as_dict()[n][i], g, msg=f"{n}, example {i}")
        model.zero_grad(set_to_none=True)
    assert not (refused and method == "auto") or psg.method == "func"


@pytest.mark.parametrize("kind", ["penalty", "first", "normed", "batch_mean"])
@pytest.mark.parametrize("method", ["hooks", "factored"])
def test_the_probe_of_an_expanded_layer_asks_the_same_of_a_model_with_dropout(method, kind):
    """The probe's tests that the copies serve their own examples alike were skipped for a model
    with an active Dropout (the copies' masks differ): the class token's first row sent its
    penalty to example 0 alone again (rows 3.5-4.6 off) and a detached norm over the copies
    changed the loss and ``p.grad``, silently with ``check_every=0`` (round 18). The probes now
    run with the modules that draw random numbers in eval mode: each is refused naming the layer,
    the batch mean is not, and its ``p.grad`` is a plain backward's with the same masks."""
    torch.manual_seed(0)
    model, refused = PenaltyBeside(kind, dropout=0.3).double(), kind != "batch_mean"
    psg = make_per_sample(model, with_penalty, method, check_every=0)
    for batch, seq in [(4, 3), (3, 2)]:
        x, y = torch.randint(0, 9, (batch, seq)), torch.randint(0, 4, (batch,))
        if refused:
            with pytest.raises(UnsupportedModelError, match=r"^(cls|pos) \(Embedding\): its "):
                psg(x, y)
            continue
        assert_a_plain_step_from_one_seed(psg, model, with_penalty, x, y, batch)
    assert model.drop.training


class PositionsMaxIntoAttention(nn.Module):
    """Positions plus their largest entries, ``(1, T, 6)``, added to the tokens before attention:
    given the batch, the positions' table is ``(B, T, 6)`` and attention a 4-D query."""

    def __init__(self) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(9, 6), nn.Embedding(8, 6)
        self.att, self.head = nn.MultiheadAttention(6, 2, batch_first=True), nn.Linear(6, 4)

    def forward(self, tokens):
        positions = self.pos(torch.arange(tokens.shape[1]))  # (T, 6)
        h = self.tok(tokens) + (positions + positions.amax(0))[None]  # (1, B, T, 6) given B
        return self.head(self.att(h, h, h)[0].mean(1))


def test_a_probe_forward_that_fails_an_assertion_given_the_batch_names_the_layer():
    """torch's attention checks its input's shape by ``assert``: the probe took only a
    RuntimeError for the expanded input's failure, so the refusal was the raw AssertionError
    (the fuzzer's ``pos:over``). Now it names the layer; ``auto`` takes ``func``."""
    torch.manual_seed(0)
    model = PositionsMaxIntoAttention().double()
    x, y = torch.randint(0, 9, (4, 3)), torch.randint(0, 4, (4,))
    with pytest.raises(UnsupportedModelError, match=r"^pos \(Embedding\): its input has no batch"):
        make_per_sample(model, F.cross_entropy, "hooks")(x, y)
    auto = make_per_sample(model, F.cross_entropy, "auto")
    auto(x, y)
    assert auto.method == "func"


class DroppedPositions(nn.Module):
    """Token embeddings plus a dropout on the position table ``(T, 6)`` (``noise``: Gaussian
    noise drawn like it, in place of the dropout): one mask for every example of the batch."""

    def __init__(self, noise: bool = False) -> None:
        super().__init__()
        self.tok, self.pos, self.head = nn.Embedding(9, 6), nn.Embedding(8, 6), nn.Linear(6, 4)
        self.drop, self.noise = nn.Dropout(0.3), noise

    def forward(self, tokens):
        positions = self.pos(torch.arange(tokens.shape[1]))  # (T, 6)
        if self.noise:
            positions = positions + 0.3 * torch.randn_like(positions)
        else:
            positions = self.drop(positions)
        return self.head(torch.tanh(self.tok(tokens) + positions).mean(1))


@pytest.mark.parametrize("noise", [False, True], ids=["dropout", "noise"])
@pytest.mark.parametrize("check_every", [0, 128])
@pytest.mark.parametrize("method", ["hooks", "factored", "auto"])
def test_random_numbers_drawn_on_an_expanded_layers_output_are_refused(method, check_every, noise):
    """A dropout (or noise) on a position table drew one mask per example once the hook path
    gave the table the batch, where the model draws one for all: the loss and p.grad were those
    of another forward than a plain step's with the same generator (p.grad up to 134 % off), with
    the check on too (round 19, F3). The probe runs the model's forward and the expanded one from
    one state of the generators and refuses where they draw differently, naming the layer;
    ``auto`` leaves the hook path saying so (``func`` draws per example, by design)."""
    torch.manual_seed(0)
    model = DroppedPositions(noise).double()
    psg = make_per_sample(model, F.cross_entropy, method, check_every=check_every)
    x, y = torch.randint(0, 9, (4, 3)), torch.randint(0, 4, (4,))
    if method == "auto":
        with contextlib.suppress(UnsupportedModelError):  # func's check: noise of no module's
            psg(x, y)
        assert psg.method != "factored" and "factored: pos (Embedding): " in psg.reason
        return
    with pytest.raises(UnsupportedModelError, match=r"^pos \(Embedding\): .* draws other random"):
        psg(x, y)
    assert all(p.grad is None for p in model.parameters()) and model.drop.training
