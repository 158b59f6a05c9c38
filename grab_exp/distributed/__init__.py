"""Orderings across data-parallel workers: ``d_rr``, ``d_grab`` and ``cd_grab`` (CD-GraB).

Each of ``W`` workers owns a seeded shard of ``n // W`` examples. The orderings run on a
real ``torch.distributed`` job (:class:`ProcessGroupComm`, launched by ``torchrun``) or on
``W`` virtual workers in one process (:class:`SimulatedComm`) with the same code.
"""

from grab_exp.balance.projection import BlockProjection
from grab_exp.distributed.cd_grab import CoordinatedGraB
from grab_exp.distributed.comm import CollectiveError, Communicator, ProcessGroupComm, SimulatedComm
from grab_exp.distributed.join import init_distributed
from grab_exp.distributed.orderings import (
    DistributedOrdering,
    DistributedRandomReshuffle,
    IndependentGraB,
)
from grab_exp.distributed.shards import ShardSplit, rank_seeds, split_shards

__all__ = [
    "BlockProjection",
    "CollectiveError",
    "Communicator",
    "CoordinatedGraB",
    "DistributedOrdering",
    "DistributedRandomReshuffle",
    "IndependentGraB",
    "ProcessGroupComm",
    "ShardSplit",
    "SimulatedComm",
    "init_distributed",
    "rank_seeds",
    "split_shards",
]
