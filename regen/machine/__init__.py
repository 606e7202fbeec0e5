"""The machine as a run meets it: GPUs, ports, the processes a run owns, signals, a ticker."""
