"""Loopback port facts, checked before launch so a taken port is never a server's mystery crash."""

from __future__ import annotations

import random
import socket
from collections.abc import Iterable
from pathlib import Path

# Below this no Linux kernel hands out client ports, whatever its configured range.
_QUIET_FLOOR = 10000


def port_is_free(host: str, port: int) -> bool:
    """True when nothing listens on (host, port) and we could bind it ourselves."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port_range(count: int, start: int = 30000, host: str = "127.0.0.1") -> int:
    """The first base port from `start` such that `count` consecutive ports are free."""
    base = start
    while base + count <= 65535:
        taken = next((p for p in range(base, base + count) if not port_is_free(host, p)), None)
        if taken is None:
            return base
        base = taken + 1
    raise OSError(f"no {count} consecutive free ports on {host} from {start}")


def ephemeral_low(proc_file: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> int:
    """The lowest port the kernel gives to client sockets (32768 where it cannot be read)."""
    try:
        return int(proc_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def quiet_port_range(count: int, host: str = "127.0.0.1") -> int:
    """A free base port for `count` servers, at a random start below the ephemeral range.

    A port found free is only free until someone binds it. Client sockets (Prefect's, the
    dispatcher's, any other process's) take ports from the ephemeral range at any moment, so
    a server port chosen there can be gone by launch time; below it only other servers
    compete, and the random start keeps two rehearsals on one machine apart.
    """
    top = max(_QUIET_FLOOR + 1, ephemeral_low() - count - 100)
    return free_port_range(count, random.randrange(_QUIET_FLOOR, top), host)


def taken_ports(addresses: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
    """The (host, port) pairs of `addresses` that something already holds, in their order.

    The one port check: the provisioning table and the fleet's launch both ask it, so a
    port a rehearsal passes is never refused at launch by another rule.
    """
    return [(host, port) for host, port in addresses if not port_is_free(host, port)]
