"""The fleet: launch SGLang (or emulator) servers, prove they generate, measure, stop them."""

from regen.fleet.bench import benchmark_fleet
from regen.fleet.commands import ServerCommand, build_server_commands
from regen.fleet.handle import Fleet
from regen.fleet.keys import generate_api_key
from regen.fleet.launch import FleetPortInUse, attach_fleet, launch_fleet
from regen.fleet.orphans import reap_orphans
from regen.fleet.report import FleetRow

__all__ = [
    "Fleet",
    "FleetPortInUse",
    "FleetRow",
    "ServerCommand",
    "attach_fleet",
    "benchmark_fleet",
    "build_server_commands",
    "generate_api_key",
    "launch_fleet",
    "reap_orphans",
]
