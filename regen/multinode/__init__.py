"""The multi-node protocol, free of Prefect: GPU nodes sharing one dataset root, no coordinator.

`nodes`: each node's settings, the starting ranges, the tally of what the nodes committed.
`claims`: leased claims on shards and each node's heartbeat. `balance`: which shard a node
claims next. `lease`: a node's hold on its shards, the fence before each commit. `loop`: claim,
generate, commit, repeat (`ClaimedShards`, a node's `regen.generation.loop.ShardSource`).
`watch`: the parent's decisions. `tasks/nodes.py` and `flows/multinode.py` only wrap these.
"""
