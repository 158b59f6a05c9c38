"""grab-exp: GraB example orderings for PyTorch and a Hydra experiment framework."""

from grab_exp.balance import Ordering, make_ordering
from grab_exp.sampler import GraBSampler
from grab_exp.source_tree import mount_conf

mount_conf()  # conf/ beside the package, when a source tree runs from PYTHONPATH

__all__ = ["GraBSampler", "Ordering", "make_ordering"]
__version__ = "0.1.0"
