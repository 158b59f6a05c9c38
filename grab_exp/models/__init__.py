"""Models for the experiments: plain ``nn.Module`` classes without BatchNorm."""

from grab_exp.models.lenet import LeNet
from grab_exp.models.logreg import LogReg
from grab_exp.models.mlp import MLP
from grab_exp.models.resnet import resnet18_gn
from grab_exp.models.word_lm import WordLM

__all__ = ["MLP", "LeNet", "LogReg", "WordLM", "resnet18_gn"]
