"""Pure planning: model cost description + device profiles + link matrix -> Plan.

No torch modules, no sockets, no clocks, no hidden randomness: the same inputs give the same plan bytes, so every
member can recompute and verify the leader's plan. See ``ARCHITECTURE.md`` ("Planning").
"""

from partitioner.blocks import BlockCost
from partitioner.canonical import (
    inputs_bytes,
    inputs_from_dict,
    inputs_hash,
    inputs_to_dict,
    plan_bytes,
    plan_from_bytes,
    plan_from_dict,
    plan_hash,
    plan_to_dict,
)
from partitioner.inputs import DeviceProfile, Link, LinkMatrix, PlanInputs, TrainingParams
from partitioner.plan import DeviceShare, Plan, PlanError, PlanMismatch, Stage
from partitioner.replicas import (
    ReplicaPlan,
    ReplicaSyncMode,
    plan_replicas,
    replica_plan_bytes,
    replica_plan_from_bytes,
    verify_replicas,
)
from partitioner.search import plan
from partitioner.verify import verify

__all__ = [
    "BlockCost",
    "DeviceProfile",
    "DeviceShare",
    "Link",
    "LinkMatrix",
    "Plan",
    "PlanError",
    "PlanInputs",
    "PlanMismatch",
    "ReplicaPlan",
    "ReplicaSyncMode",
    "Stage",
    "TrainingParams",
    "inputs_bytes",
    "inputs_from_dict",
    "inputs_hash",
    "inputs_to_dict",
    "plan",
    "plan_bytes",
    "plan_from_bytes",
    "plan_from_dict",
    "plan_hash",
    "plan_replicas",
    "plan_to_dict",
    "replica_plan_bytes",
    "replica_plan_from_bytes",
    "verify",
    "verify_replicas",
]
