"""The client side of the fleet: one dispatcher that keeps every server slot busy."""

from regen.client.dispatcher import Dispatcher
from regen.client.stats import DispatchStats, ServerState, ServerStats
from regen.client.tuning import DispatchTuning

__all__ = ["DispatchStats", "DispatchTuning", "Dispatcher", "ServerState", "ServerStats"]
