"""MINISERVE_WORKER_CPUS: parsed like taskset's CPU lists, refused when unusable, and a real
worker process ends up with every thread on the named CPU."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.settings import SettingsError, load_settings, parse_cpu_list
from worker.affinity import AffinityError, pin_process


def test_cpu_lists_parse_like_taskset():
    assert parse_cpu_list("0-3,6") == (0, 1, 2, 3, 6)
    assert parse_cpu_list(" 1 , 0 ") == (0, 1)
    assert parse_cpu_list("") == ()


@pytest.mark.parametrize("text", ["a", "3-1", "-1", "0-"])
def test_bad_cpu_list_is_a_start_error_naming_the_variable(monkeypatch, text):
    monkeypatch.setenv("MINISERVE_WORKER_CPUS", text)
    with pytest.raises(SettingsError, match="MINISERVE_WORKER_CPUS"):
        load_settings()


def test_a_cpu_this_process_cannot_use_is_refused():
    unusable = max(os.sched_getaffinity(0)) + 1
    with pytest.raises(AffinityError, match="MINISERVE_WORKER_CPUS"):
        pin_process((unusable,))


def test_no_cpus_pins_nothing():
    assert pin_process(()) == []


PROBE = """
import os, threading, time
from worker.affinity import pin_process
early = threading.Thread(target=time.sleep, args=(2,)); early.start()   # exists before pinning
pin_process((CPU,))
late = threading.Thread(target=time.sleep, args=(2,)); late.start()     # started after pinning
masks = {sorted(os.sched_getaffinity(int(t)))[0] if len(os.sched_getaffinity(int(t))) == 1 else -1
         for t in os.listdir('/proc/self/task')}
print(sorted(masks))
"""


def test_every_thread_of_the_process_is_pinned():
    cpu = max(os.sched_getaffinity(0))
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", PROBE.replace("CPU", str(cpu))], cwd=root,
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"[{cpu}]"
