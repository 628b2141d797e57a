"""Reading ``MINISERVE_REDIS_URL`` (plain or Sentinel) without connecting: stdlib only, so
the settings can check the URL without importing redis (the engine reads the settings and
knows nothing of Redis). :mod:`core.redis_conn` turns the target into connections."""
from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

SENTINEL_SCHEME = "sentinel"


class RedisUrlError(ValueError):
    """``MINISERVE_REDIS_URL`` cannot be understood."""


@dataclass(frozen=True)
class RedisTarget:
    """Where Redis is: ``url`` for a single server, or ``sentinels`` + ``master_name``."""

    url: str
    sentinels: tuple[tuple[str, int], ...] = ()
    master_name: str = ""
    db: int = 0
    password: str | None = None

    @property
    def is_sentinel(self) -> bool:
        return bool(self.sentinels)


def parse_redis_url(url: str, master_name: str = "mymaster") -> RedisTarget:
    """Read a plain or Sentinel URL; raises :class:`RedisUrlError` naming what is wrong."""
    url = url.strip()
    if not url.startswith(f"{SENTINEL_SCHEME}://"):
        if "://" not in url:
            raise RedisUrlError(f"not a URL: {url!r} (expected redis://host:port/db or sentinel://host:port;...)")
        return RedisTarget(url=url)
    if not master_name:
        raise RedisUrlError("a sentinel:// URL needs MINISERVE_REDIS_SENTINEL_MASTER")
    hosts, db, password = [], 0, None
    for part in (p.strip() for p in url.split(";") if p.strip()):
        parsed = urlsplit(part)
        if parsed.scheme != SENTINEL_SCHEME or not parsed.hostname:
            raise RedisUrlError(f"every part of a Sentinel URL must be sentinel://host:port, got {part!r}")
        try:
            hosts.append((parsed.hostname, parsed.port or 26379))
        except ValueError as exc:
            raise RedisUrlError(f"bad port in {part!r}") from exc
        if parsed.path.strip("/"):
            try:
                db = int(parsed.path.strip("/"))
            except ValueError as exc:
                raise RedisUrlError(f"bad database number in {part!r}") from exc
        if parsed.password:
            password = unquote(parsed.password)
    return RedisTarget(url=url, sentinels=tuple(hosts), master_name=master_name, db=db, password=password)
