"""Building the C kernels survives a compiler process killed from outside, and a real compile
error is still an error: a real compiler, a wrapper that SIGKILLs itself on its first run."""
from __future__ import annotations

import shutil
import stat
from pathlib import Path

import pytest

from engine.quant import native

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")


def _wrapper(folder: Path, body: str) -> str:
    path = folder / "cc-wrapper"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_a_compiler_killed_once_is_run_again(tmp_path, monkeypatch):
    marker = tmp_path / "killed-once"
    monkeypatch.setenv("CC", _wrapper(tmp_path, f'[ -e {marker} ] || {{ touch {marker}; kill -9 $$; }}\n'
                                                f'exec cc "$@" -O0'))  # -O0: a real build, quicker
    built = native.build(tmp_path / "kernels")
    assert marker.exists() and built.is_file() and built.stat().st_size > 0  # killed, then built


def test_a_compiler_that_always_fails_is_an_error_naming_the_sources(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", _wrapper(tmp_path, 'echo "q8.c:1: error: no" >&2; exit 1'))
    with pytest.raises(native.NativeBuildError, match=r"q8\.c.*3 tries.*error: no"):
        native.build(tmp_path / "kernels")
    assert not list((tmp_path / "kernels").glob("*.so"))


def test_a_vendors_defines_reach_the_compiler_and_the_build_key(tmp_path, monkeypatch):
    """Intel builds leave out the AVX2 interleaved Q4_K prefetch; other vendors keep it; each is
    its own library, never the other's reused."""
    seen = tmp_path / "argv"
    monkeypatch.setenv("CC", _wrapper(tmp_path, f'echo "$@" >> {seen}\nexec cc "$@" -O0'))
    built = {}
    for vendor in ("GenuineIntel", "AuthenticAMD"):
        monkeypatch.setattr(native, "_cpu_vendor", lambda vendor=vendor: vendor)
        built[vendor] = native.build(tmp_path / "kernels")
    intel, amd = seen.read_text().splitlines()
    assert "-DG_X16_Q4K_PREFETCH=0" in intel.split() and "-DG_X16_Q4K_PREFETCH=0" not in amd.split()
    assert built["GenuineIntel"] != built["AuthenticAMD"]
