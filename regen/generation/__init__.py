"""Stage 4's decisions, free of Prefect, so they are tested without a server.

`run_plan`: what a run must generate (planning and resume). `shard`: generate-and-commit of one
shard, with a node's fence, an `on_commit` hook and `generate_rows` for any subset of rows.
`loop`: which shard runs when (`ShardSource`: every pending shard here; a node's claims in
`regen.multinode`). `feed`: the one dispatcher and its progress. `live_gate`: the canary and
the rolling audit (the live gate). `generate`: the whole stage, canary then shards, over a
caller's way of starting a shard. `outcome`: what generation did (a shard's outcome, the run's
summary). `stopped`: the one line of a run whose generation stopped for a cause no shard gets
past (a fleet gone, a key refused, a full disk; `shard.stops_run` judges). `tasks/generate.py`
only wraps these.
"""
