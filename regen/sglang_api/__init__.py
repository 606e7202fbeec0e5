"""SGLang's wire format, the one place both sides speak it: the client sends rows with it, the
fleet probes and measures servers with it, and neither imports the other.

Nothing is re-exported here, so importing the endpoint or the request body does not load
aiohttp; import the module that holds what you need.
"""
