"""Our own CPU kernels, in C: compiled once per machine with the system compiler, loaded with ctypes.

Why C and not a torch extension: the kernel is one small file with a plain C interface, so it
compiles in about a second with ``cc`` (a torch C++ extension takes a minute and needs the
torch headers), and ``-march=native`` builds exactly the instructions this CPU has. The
library is cached under ``<cache_dir>/kernels/`` keyed by the source, the flags and the CPU's
feature list, so a changed source or another machine rebuilds it.

Loaded after torch, the library binds to the OpenMP runtime torch already loaded (same soname,
``libgomp.so.1``), so our kernels and torch's ops share one thread team instead of two
spinning against each other on the same cores.
"""
from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import logging
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import torch  # noqa: F401 - loaded first: its libgomp is the one our library binds to

from core.logs import log_event

logger = logging.getLogger("miniserve.engine.quant.native")
BUILD_TRIES = 3  # compiler runs before a failed build is an error (see _compile)

SOURCE = Path(__file__).with_name("q8.c")                # the q8 / q5 linear kernels
SOURCES = (SOURCE, Path(__file__).with_name("decode.c"),  # + the decode step's small operations
           Path(__file__).with_name("step.c"),               # + a decode / verify step of one sequence in one call
           Path(__file__).with_name("gguf.c"))               # + GGUF's block formats as stored (engine.quant.gguf_native)
HEADERS = (Path(__file__).with_name("bf16.h"),             # included by the sources: part of the build key
           Path(__file__).with_name("kernels.h"))
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=gnu11")
# What -march=native cannot say: how a vendor's cores fetch memory. Intel's lost a quarter of a
# token's time to the AVX2 interleaved Q4_K kernel's software prefetch (gguf.c says more).
VENDOR_DEFINES = {"GenuineIntel": ("-DG_X16_Q4K_PREFETCH=0",)}


class NativeBuildError(RuntimeError):
    """The C kernels could not be compiled or loaded on this machine."""


def _cpuinfo_line(*prefixes: str) -> str:
    """The first /proc/cpuinfo line starting with one of ``prefixes`` ("" where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(prefixes):
                return line
    except OSError:
        pass
    return ""


def _cpu_features() -> str:
    return _cpuinfo_line("flags", "Features")


def _cpu_vendor() -> str:
    return _cpuinfo_line("vendor_id").partition(":")[2].strip()


def flags() -> tuple[str, ...]:
    """The compiler flags for this CPU: :data:`FLAGS` and its vendor's defines."""
    return FLAGS + VENDOR_DEFINES.get(_cpu_vendor(), ())


def _cache_dir() -> Path:
    from core.settings import get_settings

    return Path(get_settings().cache_dir) / "kernels"


def _compiler() -> str:
    compiler = os.environ.get("CC", "cc")
    if shutil.which(compiler) is None:
        raise NativeBuildError(f"no C compiler: {compiler!r} is not on PATH (install gcc, or set CC)")
    return compiler


def build(directory: Path | None = None) -> Path:
    """The compiled library for these sources, flags and CPU (built under a file lock when missing)."""
    source = b"".join(path.read_bytes() for path in SOURCES + HEADERS)
    compiler = _compiler()
    key = hashlib.sha256(source + " ".join((compiler,) + flags()).encode() + _cpu_features().encode()).hexdigest()[:16]
    directory = directory or _cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"q8-{key}.so"
    if target.exists():
        return target
    with open(directory / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():
            return target
        with tempfile.TemporaryDirectory(dir=directory) as tmp:
            out = Path(tmp) / target.name
            _compile(compiler, out)
            os.replace(out, target)
    return target


def _compile(compiler: str, out: Path) -> None:
    """Run the compiler, again if it fails: a compiler process killed from outside (the OOM
    killer, an operator's SIGKILL) must not leave the worker without its kernel for good
    (under ``auto`` it would run full precision at a third of the speed; under ``q8`` every
    job would fail). A real compile error fails every try and is raised with its message."""
    for attempt in range(1, BUILD_TRIES + 1):
        returncode, stderr = _run_compiler([compiler, *flags(), "-o", str(out), *map(str, SOURCES), "-lm"])
        if returncode == 0:
            return
        why = f"killed by signal {-returncode}" if returncode < 0 else stderr.strip()[-800:]
        log_event(logger, "kernel_build_failed", level=logging.WARNING, attempt=attempt, returncode=returncode)
    names = ", ".join(path.name for path in SOURCES)
    raise NativeBuildError(f"compiling {names} failed ({BUILD_TRIES} tries): {why}")


def _run_compiler(argv: list[str]) -> tuple[int, str]:
    """(return code, stderr) of one compiler run, in a process group of its own. Waits for the
    compiler process only, not for its pipes: a killed ``cc`` leaves its ``cc1`` running,
    which would hold a stderr pipe open until it finished; the group is killed instead."""
    with tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)
        returncode = proc.wait()
        if returncode != 0:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # what the dead compiler left running
            except (ProcessLookupError, PermissionError):
                pass
        stderr.seek(0)
        return returncode, stderr.read().decode(errors="replace")


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """The loaded kernel library (built on first use); raises :class:`NativeBuildError`."""
    try:
        lib = ctypes.CDLL(str(build()))
    except OSError as exc:
        raise NativeBuildError(f"loading the compiled kernels failed: {exc}") from exc
    linear_args = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                   ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                   ctypes.c_int, ctypes.c_int]
    for fn in (lib.ms_q8_linear, lib.ms_q5_linear):
        fn.restype, fn.argtypes = ctypes.c_int, linear_args
    lib.ms_q5_row_bytes.restype, lib.ms_q5_row_bytes.argtypes = ctypes.c_int64, [ctypes.c_int64]
    lib.ms_q8_dequant_bf16.restype = ctypes.c_int
    lib.ms_q8_dequant_bf16.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int64,
                                       ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]
    lib.ms_q5_rows.restype = ctypes.c_int
    lib.ms_q5_rows.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                               ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]
    lib.ms_q8_simd.restype = ctypes.c_int
    _declare_decode(lib)
    return lib


def _declare_decode(lib: ctypes.CDLL) -> None:
    """Signatures of decode.c's functions (engine.ops.c_calls calls them)."""
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    signatures = {
        "ms_rms_norm_bf16": [ptr, ptr, ptr, i64, i64, ctypes.c_float, ctypes.c_int],
        "ms_rotary_bf16": [ptr, i64, i64, i64, i64, ptr, ptr],
        "ms_silu_mul_bf16": [ptr, ptr, i64, i64],
        "ms_attend_decode_bf16": [ptr, ptr, ptr, ptr, ptr, i64, i64, i64, i64, i64, ctypes.c_float, ptr,
                                  ctypes.c_int],
        "ms_attend_rows_bf16": [ptr, ptr, ptr, ptr, ptr, i64, i64, i64, i64, i64, i64, ctypes.c_float, ptr,
                                ctypes.c_int],
        "ms_paged_gather_bf16": [ptr, ptr, ptr, i64, ptr, ptr, i64, i64, i64, i64, i64, ptr, i64, i64, i64, ptr, ptr],
        "ms_paged_attend_bf16": [ptr, ptr, ptr, ptr, ptr, i64, i64, i64, ptr, i64, ptr, ptr, i64, i64, i64, i64,
                                 ctypes.c_float, ptr, ctypes.c_int, ctypes.c_int],
    }
    for name, args in signatures.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = ctypes.c_int, args
    # step.c (engine.quant.step): the model description, then the step's tokens and buffers
    lib.ms_decode_step.restype = ctypes.c_int
    lib.ms_decode_step.argtypes = [ptr, ptr, i64, ctypes.c_int, ptr, ptr, i64, ptr, i64, i64, ptr, ptr, i64, ptr,
                                   ctypes.c_int, ptr, i64, ptr, ctypes.c_int32]


VECTOR_PATHS = {2: "avx512-vnni", 1: "avx2", 0: "portable"}


def vector_path() -> str:
    """Which path of q8.c this CPU's build runs: ``avx512-vnni``, ``avx2`` (both fast), or
    ``portable`` (a plain C loop, slower than bf16)."""
    return VECTOR_PATHS[library().ms_q8_simd()]
