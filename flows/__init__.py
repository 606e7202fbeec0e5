"""The Prefect flows: the top layer, the one that knows every package a run imports."""

# What the provisioning code check compiles and imports: the library and every layer over
# it. Named here, at the top, because the library below must not know what sits above it.
CODE_PACKAGES = ("regen", "tasks", "flows", "blocks")
