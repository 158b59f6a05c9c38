"""torchvision's ResNet-18 for CIFAR-10 with its BatchNorm layers turned into GroupNorm
(``batchnorm_to_groupnorm``: per-sample gradients are undefined under BatchNorm), trained on a
subset of CIFAR-10 from the offline JPEG archive; GraB against random reshuffling.

    python examples/resnet_groupnorm.py --epochs 2 --examples 2000
"""

from __future__ import annotations

from grab_vs_rr import arguments, compare
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset
from torchvision.models import resnet18

from grab_exp.data import load_cifar10_jpeg
from grab_exp.per_sample import batchnorm_to_groupnorm


def resnet18_gn() -> nn.Module:
    """ResNet-18 with a 3x3 stem and no max-pool (32x32 inputs), GroupNorm for BatchNorm."""
    model = resnet18(num_classes=10)
    model.conv1 = nn.Conv2d(3, 64, 3, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return batchnorm_to_groupnorm(model)


if __name__ == "__main__":
    args = arguments(__doc__.splitlines()[0], epochs=2, examples=2000)
    data = load_cifar10_jpeg(subset=args.examples)  # ../shared/data/cifar10-jpeg.tar.gz
    train_set = TensorDataset(data.train_x, data.train_y)
    compare(resnet18_gn, train_set, F.cross_entropy, args, lr=0.01)
