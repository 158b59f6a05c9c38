"""HuggingFace models as users bring them (found by an adversarial review): a forward whose first
run installs hooks and sets a flag (transformers 5's hidden-state capture), and float64 models
that compute parts in float32 (``LlamaRMSNorm``). Each over several calls of one ``psg``, against
a float64 per-example loop and a plain step."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from fuzz.reference import reference

from grab_exp.per_sample import make_per_sample

transformers = pytest.importorskip("transformers")


def tiny_bert():
    config = transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=32, num_labels=3, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    return transformers.BertForSequenceClassification(config).double().eval()


def tiny_llama():
    config = transformers.LlamaConfig(
        vocab_size=20, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32, pad_token_id=0,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config).double().eval()


def penultimate_loss(out, y):
    """A probe on the penultimate layer's features beside the classifier's loss."""
    return F.cross_entropy(out.logits, y) + out.hidden_states[-2].pow(2).mean()


def token_loss(out, y):
    return F.cross_entropy(out.logits.transpose(1, 2), y, reduction="none").mean(1).mean()


def check_calls(model, loss_fn, method, batches, rows_rtol: float) -> None:
    """One ``psg`` over ``batches``: rows within ``rows_rtol`` of their largest entry (or of a
    millionth of the largest of any) of each example's gradient alone, ``p.grad`` the plain
    step's."""
    psg = make_per_sample(model, loss_fn, method)
    for k, (x, y) in enumerate(batches):
        want = reference(copy.deepcopy(model), loss_fn, x, y)  # the fuzzer's, on a twin
        model.zero_grad(set_to_none=True)
        _, grads = psg(x, y)
        largest = max(rows.abs().max() for rows in want.rows.values())  # a gradient cancels to 0
        for name, rows in grads.as_dict().items():
            scale = want.rows[name].abs().max().clamp_min(1e-6 * largest)
            gap = ((rows - want.rows[name]).abs().max() / scale).item()
            assert gap <= rows_rtol, f"call {k}: rows of {name} off by {gap:.2g} of their largest"
        for name, p in model.named_parameters():
            torch.testing.assert_close(p.grad, want.grads[name], msg=f"call {k}: p.grad of {name}")


@pytest.mark.parametrize("method", ["auto", "hooks", "loop"])
def test_hooks_a_first_forward_installs_are_not_installed_again(method: str) -> None:
    """At b326fdb every extra forward deleted the flag that transformers 5 sets with its capture
    hooks, so the next one installed them again: 23 hidden states, not 3, and a silently wrong
    loss on auto (p.grad 380 times off); the model kept them afterwards."""
    torch.manual_seed(0)
    model, g = tiny_bert(), torch.Generator().manual_seed(1)
    batches = []
    for size, length in [(4, 7), (3, 7), (2, 9), (4, 5)]:
        ids = torch.randint(2, 50, (size, length), generator=g)
        x = {"input_ids": ids, "output_hidden_states": True}
        batches.append((x, torch.randint(0, 3, (size,), generator=g)))
    check_calls(model, penultimate_loss, method, batches, rows_rtol=1e-7)
    ids = torch.randint(2, 50, (2, 7), generator=g)
    assert len(model(input_ids=ids, output_hidden_states=True).hidden_states) == 3


@pytest.mark.parametrize("method", ["auto", "hooks", "factored", "loop"])
def test_a_float64_model_that_normalizes_in_float32_is_right(method: str) -> None:
    """``LlamaRMSNorm`` computes in float32 whatever the model's dtype: its rows and the batch's
    differ by float32 rounding (~1e-7), which the float64 tolerances now allow (at b326fdb every
    method refused it, naming rows 'not those of the examples' or a coupling of examples)."""
    torch.manual_seed(0)
    model, g = tiny_llama(), torch.Generator().manual_seed(1)
    batches = []
    for size, length in [(4, 7), (4, 7), (3, 7), (2, 9)]:
        ids = torch.randint(1, 20, (size, length), generator=g)
        batches.append(({"input_ids": ids}, torch.randint(1, 20, (size, length), generator=g)))
    check_calls(model, token_loss, method, batches, rows_rtol=1e-5)


class TinyViT(torch.nn.Module):
    """A one-layer HuggingFace ViT (eager attention) and a head on its class token."""

    def __init__(self) -> None:
        super().__init__()
        config = transformers.ViTConfig(
            image_size=8, patch_size=4, num_channels=2, hidden_size=8, num_hidden_layers=1,
            num_attention_heads=2, intermediate_size=16, attn_implementation="eager",
        )  # fmt: skip
        self.vit = transformers.ViTModel(config, add_pooling_layer=False)
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x):
        return self.head(self.vit(pixel_values=x).last_hidden_state[:, 0])


@pytest.mark.parametrize("method", ["auto", "hooks", "factored"])
def test_a_gradient_that_cancels_to_zero_in_float64_is_judged_against_the_largest(method: str):
    """The key projection's bias has a zero gradient in exact arithmetic (softmax ignores a shift
    of every key), so its rows are float64 rounding, about 5e-11 of the largest rows: the one
    example alone check measured it against a floor of 1e-6 of the largest and refused a call
    as a backward that couples the examples (round 19, F5). The per-example checks' float64
    floor is that of the rows' mean, 1e-5."""
    torch.manual_seed(0)
    model, g = TinyViT().double(), torch.Generator().manual_seed(0)
    batches = []
    for size in [3, 7, 1, 2, 5, 4, 6, 8]:
        x = torch.randn(size, 2, 8, 8, generator=g).double()
        batches.append((x, torch.randint(0, 5, (size,), generator=g)))
    check_calls(model, F.cross_entropy, method, batches, rows_rtol=1e-4)  # that bias: rounding


class Wav2Vec2Classifier(torch.nn.Module):
    """A tiny HuggingFace wav2vec2 classifier in training mode, SpecAugment on: its time masks
    are drawn from numpy's global generator in the forward."""

    def __init__(self) -> None:
        super().__init__()
        config = transformers.Wav2Vec2Config(
            hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
            conv_dim=(8, 8), conv_stride=(4, 2), conv_kernel=(8, 4), num_conv_pos_embeddings=4,
            num_conv_pos_embedding_groups=2, feat_extract_norm="group", mask_time_prob=0.3,
            mask_time_length=2, mask_time_min_masks=1, hidden_dropout=0.0, layerdrop=0.0,
            attention_dropout=0.0, activation_dropout=0.0, feat_proj_dropout=0.0,
            final_dropout=0.0, vocab_size=6, num_labels=3,
        )  # fmt: skip
        self.net = transformers.Wav2Vec2ForSequenceClassification(config).train()

    def forward(self, wave: torch.Tensor) -> torch.Tensor:
        return self.net(input_values=wave).logits


def test_wav2vec2_with_specaugment_is_refused_naming_each_methods_cause() -> None:
    """Adversarial round 41: numpy's SpecAugment masks. loop was silently wrong before 172264b
    (its examples alone drew other masks, unseen); after it, auto ended on func with its rows'
    mean as param.grad, where vmap drew one mask for every example: param.grad 0.08-0.79 off a
    plain step, silently. auto refuses now, with each method's cause: the hook path a
    parametrized layer (weight_norm), func numpy's draws, loop the draws."""
    torch.manual_seed(0)
    model = Wav2Vec2Classifier()
    psg = make_per_sample(model, F.cross_entropy)
    g = torch.Generator().manual_seed(1)
    for size in (3, 2):
        wave, y = torch.randn(size, 160, generator=g), torch.randint(0, 3, (size,), generator=g)
        with pytest.raises(ValueError) as refused:
            psg(wave, y)
        hooks, func, loop = str(refused.value).split(" | ")
        assert "is parametrized" in hooks
        assert "draws from numpy's or Python's random generator" in func
        assert "draws random numbers in its forward" in loop
        assert all(p.grad is None for p in model.parameters())
