"""Models: LeNet's exact size and shapes; every model forwards CIFAR-shaped batches."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch import nn

from grab_exp.models import MLP, LeNet, LogReg

CONF = Path(__file__).resolve().parents[2] / "conf"
MODEL_CONFIGS = sorted((CONF / "model").glob("*.yaml"))


def parameter_count(model: nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())


def test_lenet_has_exactly_62006_parameters():
    assert parameter_count(LeNet()) == 62_006


def test_lenet_layer_shapes_follow_lenet5():
    model = LeNet()
    assert model.conv1.weight.shape == (6, 3, 5, 5)
    assert model.conv2.weight.shape == (16, 6, 5, 5)
    assert [layer.weight.shape for layer in (model.fc1, model.fc2, model.fc3)] == [
        (120, 400),
        (84, 120),
        (10, 84),
    ]


@pytest.mark.parametrize("model_class", [LeNet, MLP, LogReg])
@pytest.mark.parametrize("batch_size", [1, 7])
def test_models_map_cifar_batches_to_logits(model_class, batch_size):
    images = torch.randn(batch_size, 3, 32, 32)
    logits = model_class()(images)
    assert logits.shape == (batch_size, 10)
    assert logits.dtype == torch.float32


@pytest.mark.parametrize("model_class", [LeNet, MLP, LogReg])
def test_num_classes_sets_the_output_width(model_class):
    assert model_class(num_classes=3)(torch.randn(2, 3, 32, 32)).shape == (2, 3)


@pytest.mark.parametrize("model_class", [LeNet, MLP, LogReg])
def test_models_have_no_batchnorm_or_dropout(model_class):
    banned = (nn.modules.batchnorm._BatchNorm, nn.modules.dropout._DropoutNd, nn.Dropout)
    assert not any(isinstance(module, banned) for module in model_class().modules())


def test_mlp_hidden_widths_and_linear_case():
    assert parameter_count(MLP(hidden=(256,))) == 3072 * 256 + 256 + 256 * 10 + 10
    assert parameter_count(MLP(hidden=(64, 32))) == (3072 * 64 + 64) + (64 * 32 + 32) + 330
    assert parameter_count(MLP(hidden=())) == parameter_count(LogReg())


def test_logreg_is_one_linear_layer():
    assert parameter_count(LogReg()) == 3072 * 10 + 10


def test_model_config_group_has_the_models():
    names = [path.stem for path in MODEL_CONFIGS]
    assert names == ["lenet", "logreg", "mlp", "resnet18_gn", "word_lm"]


@pytest.mark.parametrize("config_path", MODEL_CONFIGS, ids=lambda path: path.stem)
def test_every_model_config_instantiates_and_forwards(config_path):
    node = OmegaConf.load(config_path)
    vocabulary = 11  # word_lm's is the data's (num_classes: null)
    data = {"num_classes": vocabulary, "in_features": 3 * 32 * 32}  # mlp's, logreg's input size
    model = instantiate(node, **{key: v for key, v in data.items() if node.get(key, 0) is None})
    assert isinstance(model, nn.Module)
    if config_path.stem == "word_lm":  # (B, T) tokens -> (B, T, vocabulary) logits
        tokens = torch.randint(0, vocabulary, (4, 7))
        assert model(tokens).shape == (4, 7, vocabulary)
    else:
        assert model(torch.randn(4, 3, 32, 32)).shape == (4, 10)


def test_the_resnet_preset_has_torchvisions_resnet18_parameters_with_groupnorm():
    model = instantiate(OmegaConf.load(CONF / "model" / "resnet18_gn.yaml"))
    norms = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
    assert norms and not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert parameter_count(model) == 11_173_962
