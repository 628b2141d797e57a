"""``client_gone`` on real sockets: a closed peer is gone; an idle or pipelining one is not."""
from __future__ import annotations

import socket

from web.disconnect import client_gone


def test_an_idle_peer_is_here_and_a_closed_one_is_gone():
    server, client = socket.socketpair()
    with server:
        environ = {"gunicorn.socket": server}
        assert client_gone(environ) is False
        client.close()
        assert client_gone(environ) is True


def test_a_peer_pipelining_its_next_request_is_not_gone_and_its_bytes_stay():
    server, client = socket.socketpair()
    with server, client:
        client.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
        assert client_gone({"gunicorn.socket": server}) is False
        assert server.recv(3) == b"GET"


def test_without_a_gunicorn_socket_nobody_is_gone():
    assert client_gone({}) is False and client_gone({"gunicorn.socket": object()}) is False
