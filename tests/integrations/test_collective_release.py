"""release_collectives: a read blocked on a peer connection fails at once; the store's connection stays.

It shuts down every peer connection of its process, so it runs in a child process of its own (the
test process's other connections are left alone); this test plays the rendezvous store.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="lists /proc/self/fd")

CHILD = """
import socket, sys, threading
from ucp.integrations.collective_release import release_collectives

store_port = int(sys.argv[1])
to_store = socket.create_connection(("127.0.0.1", store_port))
peers = socket.create_server(("127.0.0.1", 0))
client = socket.create_connection(peers.getsockname())  # a gloo pair: this process waits for the peer
server, _ = peers.accept()
got = []
reader = threading.Thread(target=lambda: got.append(client.recv(1)))
reader.start()
released = release_collectives(keep_port=store_port)  # both ends of the pair are here: 2
reader.join(timeout=10)
to_store.sendall(b"x")
print(released, reader.is_alive(), got, to_store.recv(1), flush=True)
"""


def test_a_blocked_peer_read_is_released_and_the_store_connection_kept():
    with socket.create_server(("127.0.0.1", 0)) as store:

        def echo() -> None:
            conn, _ = store.accept()
            with conn:
                conn.sendall(conn.recv(1))

        serving = threading.Thread(target=echo, daemon=True)
        serving.start()
        out = subprocess.run([sys.executable, "-c", CHILD, str(store.getsockname()[1])], capture_output=True,
                             text=True, timeout=60)
        serving.join(timeout=10)
    assert out.returncode == 0, out.stderr
    # the blocked read ended with the connection shut down; the store answered after the release
    assert out.stdout.split("\n")[0] == "2 False [b''] b'x'"
