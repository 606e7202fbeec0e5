"""The audit's row checks, one module each: what it counts, how it measures a row or a shard,
how its figure is graded and its title. `regen.audit.registry.CHECKS` lists them in report
order; the summary, the gates, the report and the per-server and per-setting tables find them
there. This package imports none of its modules, so a check imports another's helpers without
pulling in the registry.
"""
