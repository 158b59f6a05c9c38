"""Models for the experiments: plain ``nn.Module`` classes without BatchNorm or Dropout."""

from grab_exp.models.lenet import LeNet
from grab_exp.models.logreg import LogReg
from grab_exp.models.mlp import MLP

__all__ = ["MLP", "LeNet", "LogReg"]
