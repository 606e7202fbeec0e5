"""Stage 4's decisions, free of Prefect: what a run must generate (`plan`), how one shard is
generated and committed (`shard`), how a node of a multi-node run claims its shards (`claims`,
`lease`), and what generation did (`summary`). `tasks/generate.py` only wraps them.
"""
