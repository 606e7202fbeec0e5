"""Loopback port facts, checked before launch so a taken port is never a server's mystery crash."""

from __future__ import annotations

import socket


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
