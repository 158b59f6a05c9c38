"""grab-exp: GraB example orderings for PyTorch and a Hydra experiment framework."""

from grab_exp.balance import Balance, make_balance
from grab_exp.sampler import GraBSampler

__all__ = ["Balance", "GraBSampler", "make_balance"]
__version__ = "0.1.0"
