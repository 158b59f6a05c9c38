"""What importing the models costs: torchvision only where ResNet-18 is built."""

import subprocess
import sys

from support.grab_run import cli_env

CODE = """
import sys
import grab_exp.__main__, grab_exp.models, grab_exp.runner.training.job
from grab_exp.models import LeNet, MLP
LeNet(10); MLP(8, (4,), 3)
print("torchvision" in sys.modules)
from grab_exp.models import resnet18_gn
resnet18_gn(10)
print("torchvision" in sys.modules)
"""


def test_torchvision_is_imported_only_when_a_resnet_is_built():
    """A mismatched torchvision (``operator torchvision::nms does not exist``) stops only the
    runs that use it, not a LeNet or synthetic run."""
    done = subprocess.run(
        [sys.executable, "-c", CODE], env=cli_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]
