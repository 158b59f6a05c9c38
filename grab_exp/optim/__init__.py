"""VRGD optimizers (GSNR-scaled SGD, momentum and Adam) and the GSNR statistics they use."""

from grab_exp.optim.base import CLIP_HIGH, CLIP_LOW, GSNROptimizer, device_step
from grab_exp.optim.gsnr import GSNRStats, gsnr_ratios
from grab_exp.optim.vr_adam import VRAdam
from grab_exp.optim.vr_momentum import VRMomentum
from grab_exp.optim.vr_sgd import VRSGD

__all__ = [
    "CLIP_HIGH",
    "CLIP_LOW",
    "VRSGD",
    "GSNROptimizer",
    "GSNRStats",
    "VRAdam",
    "VRMomentum",
    "device_step",
    "gsnr_ratios",
]
