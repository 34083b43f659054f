"""Free loopback ports for servers a test starts."""

from __future__ import annotations

import contextlib
import socket


def free_ports(count: int) -> tuple[int, ...]:
    """`count` ports nothing listens on now, all different (held together while the kernel
    picks them, released for the caller to bind)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return tuple(s.getsockname()[1] for s in sockets)


def free_port() -> int:
    return free_ports(1)[0]
