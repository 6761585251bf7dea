"""A free loopback port for a test's server or process group (never a fixed one: tests run
in two xdist workers at once, and a port in TIME_WAIT or taken by the other worker fails)."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
