"""A safety net for a call that must not hang: it runs in a thread, and a test fails (not
hangs) when the call has not returned within 30 s. What a test asserts is the call's answer;
how long it took below the net is a benchmark's business (``python -m bench``)."""
from __future__ import annotations

import threading
from typing import Any, Callable

NET_S = 30.0


def returns(call: Callable[[], Any], net_s: float = NET_S) -> Any:
    """``call()``'s value (or its exception, raised here); fails when it is still running after ``net_s``."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(net_s)
    assert not thread.is_alive(), f"the call did not return within the {net_s:.0f} s safety net"
    if "error" in box:
        raise box["error"]
    return box["value"]
