"""A run's progress, in parts: `snapshot` (the value `progress.json` holds, read and written),
`meter` (rates over the last minute from the dispatcher's counters), `writer` (the thread that
rewrites `progress.json`), `status` (`regen status`: a run at a glance from its root alone)
and `fleet_live` (the servers' own figures beside it). Their words are `regen.display.progress`.

Nothing is imported here, so reading a snapshot (`regen status`) loads neither the writer's
thread nor a terminal library.
"""
