"""The playground is served at ``/`` (public, self-contained: every asset from this server),
lists every generation method, and leaves ``/docs`` and ``/openapi.json`` where they were."""
from __future__ import annotations

import re

from core.settings import GENERATION_METHODS
from tests.web.test_monitor import SHARED_ASSETS


def test_root_is_the_playground_with_local_assets_and_no_key(make_app):
    client = make_app(api_keys=["k"]).test_client()
    page = client.get("/")
    assert page.status_code == 200 and b"MiniServe playground" in page.data
    assets = re.findall(rb'(?:src|href)="([^"]+)"', page.data)
    assert not [a for a in assets if a.startswith((b"http:", b"https:", b"//"))]
    for name in (b"api.js", b"chat.js", b"compare.js", b"playground.css"):
        asset = b"/playground/static/" + name
        assert asset in assets and client.get(asset.decode()).status_code == 200
    for asset in SHARED_ASSETS:  # the helpers the monitor page loads too: one copy
        assert asset in assets and client.get(asset.decode()).status_code == 200
    options = re.findall(rb"<option(?: selected)?>([a-z_]+)</option>", page.data)
    assert [o.decode() for o in options if o.decode() in GENERATION_METHODS] == list(GENERATION_METHODS)
    assert client.get("/docs").status_code == 200 and client.get("/openapi.json").status_code == 200
    assert client.post("/jobs", json={"prompt": "hi"}).status_code == 401  # the API still wants the key
