"""Where a webhook may go: the guard against server-side request forgery.

A webhook makes our worker send a request to a URL a client chose, from inside our network.
So a target must be ``http``/``https``, and every address its host resolves to must be a
public one: no private, loopback, link-local, multicast, reserved or unspecified address
(IPv4-mapped IPv6 is judged as the IPv4 address it holds). The sender then connects to an
address checked here, never to a name resolved again, so a DNS answer that changes between
the check and the connection (DNS rebinding) cannot slip past. Hosts listed in
``MINISERVE_WEBHOOK_ALLOW_HOSTS`` (a name as written in the URL, or an address) skip the
address rule: the tests list 127.0.0.1.

The web checks a ``webhook_url`` at submit (a 400 naming it); the worker checks again at each
try, since what a name resolves to can change.
"""
from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlsplit

MAX_URL_CHARS = 2048
DEFAULT_PORTS = {"http": 80, "https": 443}
Resolver = Callable[[str, int], list[str]]


class TargetRefused(ValueError):
    """The URL is not a webhook target we send to; the message says why."""


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str          # as the URL names it (the Host header, and the TLS server name)
    port: int
    path: str          # path and query, as sent on the request line
    addresses: tuple[str, ...]  # checked addresses, in the resolver's order: connect to these only


def resolve(host: str, port: int) -> list[str]:
    """Every address the host has (A and AAAA), in the system resolver's order."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise TargetRefused(f"host '{host}' does not resolve ({exc})") from None
    seen: list[str] = []
    for info in infos:
        address = str(info[4][0])
        if address not in seen:
            seen.append(address)
    return seen


def not_public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return (ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_reserved
            or ip.is_unspecified or not ip.is_global)


def parse(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, path with query) of an absolute http(s) URL, or TargetRefused."""
    if len(url) > MAX_URL_CHARS:
        raise TargetRefused(f"longer than {MAX_URL_CHARS} characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise TargetRefused(f"not a URL ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise TargetRefused("only http and https URLs")
    if not parts.hostname:
        raise TargetRefused("the URL names no host")
    if parts.username is not None or parts.password is not None:
        raise TargetRefused("no user or password in the URL")
    if any(ch.isspace() or ord(ch) < 32 for ch in url):
        raise TargetRefused("no spaces or control characters in the URL")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return scheme, parts.hostname.lower(), port or DEFAULT_PORTS[scheme], path


def check(url: str, allow_hosts: tuple[str, ...] = (), resolver: Resolver = resolve) -> Target:
    """The target, its addresses resolved and each one checked (TargetRefused otherwise)."""
    scheme, host, port, path = parse(url)
    addresses = resolver(host, port)
    if not addresses:
        raise TargetRefused(f"host '{host}' has no address")
    if host not in allow_hosts:
        for address in addresses:
            if address.split("%", 1)[0] not in allow_hosts and not_public(address):
                raise TargetRefused(f"host '{host}' resolves to {address}, which is not a public address "
                                    "(MINISERVE_WEBHOOK_ALLOW_HOSTS lists exceptions)")
    return Target(scheme, host, port, path, tuple(addresses))
