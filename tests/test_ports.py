"""Server ports are picked where no client socket can take them between the check and the launch."""

from __future__ import annotations

import socket
from pathlib import Path

from regen.machine.ports import (
    ephemeral_low,
    free_port_range,
    port_is_free,
    quiet_port_range,
    taken_ports,
)


def test_ephemeral_low_reads_the_kernel_range_and_falls_back(tmp_path: Path) -> None:
    proc = tmp_path / "ip_local_port_range"
    proc.write_text("40000\t60999\n")
    assert ephemeral_low(proc) == 40000
    assert ephemeral_low(tmp_path / "missing") == 32768
    proc.write_text("garbage")
    assert ephemeral_low(proc) == 32768


def test_quiet_range_is_free_and_below_client_ports() -> None:
    low = ephemeral_low()
    starts = {quiet_port_range(3) for _ in range(20)}
    assert len(starts) > 1, "every rehearsal would race for the same ports"
    for base in starts:
        assert base + 3 <= low, (base, low)
        assert all(port_is_free("127.0.0.1", base + i) for i in range(3))


def test_free_range_steps_past_a_listening_port() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", quiet_port_range(1)))
        held.listen()
        port = held.getsockname()[1]
        assert not port_is_free("127.0.0.1", port)
        assert free_port_range(2, port) > port


def test_taken_ports_names_only_the_held_ones_in_order() -> None:
    """The one port check the provisioning table and the fleet launch share."""
    with socket.socket() as held:
        base = quiet_port_range(3)
        held.bind(("127.0.0.1", base + 1))
        held.listen()
        addresses = [("127.0.0.1", base + i) for i in (2, 1, 0)]
        assert taken_ports(addresses) == [("127.0.0.1", base + 1)]
    assert taken_ports(addresses) == []
