"""Each server at its best concurrency: a controller that measures every server while it
generates (`controller`, no I/O) and the thread that feeds it and sets the dispatcher's
slots (`tuner`)."""

from regen.concurrency.controller import Controller, Decision, Phase, Sample, TunerSettings

__all__ = ["Controller", "Decision", "Phase", "Sample", "TunerSettings"]
