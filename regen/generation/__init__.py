"""Stage 4's decisions, free of Prefect, so they are tested without a server.

`run_plan`: what a run must generate (planning and resume). `shard`: generate-and-commit of one
shard, with the lease fence, an `on_commit` hook and `generate_rows` for any subset of rows.
`loop`: which shard runs when (all at once, or claimed one by one by a node of several).
`lease`: a node's hold on its shards. `feed`: the one dispatcher and its progress.
`live_gate`: the canary and the rolling audit (the live gate). `generate`: the whole stage, canary
then shards, over a caller's way of starting a shard. `watch`: the multi-node parent's
decisions. `outcome`: what generation did (a shard's outcome, the run's summary).
`tasks/generate.py` and `tasks/nodes.py` only wrap these.
"""
