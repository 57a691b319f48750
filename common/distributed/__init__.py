"""Context parallelism: ring attention over ``torch.distributed`` with any implementation that returns
the LSE (``ring``), zig-zag sharding for causal load balance (``zigzag``), and the sampled float64
check of a sharded output (``check``), and leaving a process group so that the interpreter can exit
(``teardown``)."""

from common.distributed.ring import merge_partial_, ring_attention
from common.distributed.teardown import leaving_process_group
from common.distributed.zigzag import chunk_ids, shard, step_plan, unshard

__all__ = ["chunk_ids", "leaving_process_group", "merge_partial_", "ring_attention", "shard", "step_plan", "unshard"]
