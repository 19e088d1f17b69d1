"""Releasing a rank blocked in a gloo collective whose generation is over.

After a failure, a survivor blocked in a collective with the dead rank fails at once (the dead
peer's sockets close). One blocked with *live* peers that already left for the next generation
does not: gloo waits for their data until the group's timeout, and it has no abort
(``ProcessGroup.abort()``, ``destroy_process_group()``, dropping every reference: none of them
releases a wait in progress). :func:`release_collectives` shuts down this process's TCP
connections to its peers (every TCP socket with a peer, except those to the rendezvous store),
so gloo's pending reads fail at once with "Connection closed" and the collective raises in the
waiting thread, as it does for a dead peer. The elastic context calls it from its beat thread
once a newer generation is published and the main thread has not come to join it (see
:mod:`ucp.integrations.elastic`). Linux only (it lists ``/proc/self/fd``); elsewhere it does
nothing and the group's timeout bounds the wait. With NCCL, ``ProcessGroupNCCL.abort()`` is the
supported way.

    released = release_collectives(keep_port=store_port)
"""

from __future__ import annotations

import os
import socket
import stat

__all__ = ["release_collectives", "socket_fds"]


def socket_fds() -> set[int]:
    """The file descriptors of this process that are sockets (empty where /proc is not there)."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return set()
    out = set()
    for name in names:
        try:
            if stat.S_ISSOCK(os.fstat(int(name)).st_mode):
                out.add(int(name))
        except (OSError, ValueError):
            continue
    return out


def release_collectives(*, keep_port: int, also: frozenset[int] | set[int] = frozenset()) -> int:
    """Shut down every connected TCP socket of this process whose peer port is not ``keep_port``
    (the rendezvous store's), and the sockets ``also`` names even if they go to it (the process
    group's own store connection); returns how many. Listening sockets, pipes and Unix sockets
    are left."""
    released = 0
    for fd in sorted(socket_fds()):
        try:
            sock = socket.socket(fileno=os.dup(fd))  # a duplicate: closing it leaves the original open
        except OSError:
            continue
        try:
            if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM:
                if sock.getpeername()[1] != keep_port or fd in also:
                    sock.shutdown(socket.SHUT_RDWR)  # acts on the connection, so on the original too
                    released += 1
        except OSError:
            pass  # not connected (a listener), or already closed
        finally:
            sock.close()
    return released
