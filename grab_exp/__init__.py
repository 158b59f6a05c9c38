"""grab-exp: GraB example orderings for PyTorch and a Hydra experiment framework."""

from grab_exp.balance import Ordering, make_ordering
from grab_exp.sampler import GraBSampler

__all__ = ["GraBSampler", "Ordering", "make_ordering"]
__version__ = "0.1.0"
