"""Values over several devices: MultiLazyBuffer (one lazy value per device and the axis they split, with the sharding
rules) and the collectives that move data between the shards (one implementation per kind of device). Tensor.shard
makes them; docs/multi_device.md describes the rules."""
from tgrad.multi.multilazy import MultiLazyBuffer, check_split
from tgrad.multi.collectives import Collectives, CopyCollectives, StepCollectives, collectives_for

__all__ = ["MultiLazyBuffer", "check_split", "Collectives", "CopyCollectives", "StepCollectives",
           "collectives_for"]
