"""torchvision's ResNet-18 for CIFAR-10 with GroupNorm in place of BatchNorm (per-sample
gradients are undefined under BatchNorm; ``batchnorm_to_groupnorm`` converts a model of yours),
trained on a subset of CIFAR-10 (torchvision's, downloaded on first use); GraB against random
reshuffling.

    python examples/resnet_groupnorm.py --epochs 2 --examples 2000
    python examples/resnet_groupnorm.py --synthetic   # offline (or --archive PATH: a JPEG copy)
"""

from __future__ import annotations

from grab_vs_rr import arguments, cifar10, compare
from torch.nn import functional as F

from grab_exp.models import resnet18_gn  # the model=resnet18_gn preset of the runner

if __name__ == "__main__":
    args = arguments(__doc__.splitlines()[0], epochs=2, examples=2000, images=True)
    compare(resnet18_gn, cifar10(args), F.cross_entropy, args, lr=0.01)
