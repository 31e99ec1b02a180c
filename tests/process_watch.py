"""Watching real processes from outside the plugin: a session's live members, an inner run's output.

The lifecycle tests and the watchdog benchmark judge the plugin by what the kernel says, not by
what the plugin reports, so they read ``/proc`` themselves; and they drive inner pytest runs whose
progress they learn only from the run's output file.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import pytest


def session_pids(sid: int) -> list[int]:
    """Every live process whose session id is ``sid`` (zombies and dead ones left out)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] not in ("Z", "X") and int(fields[3]) == sid:
            pids.append(int(entry))
    return pids


def wait_for_output(proc: subprocess.Popen[bytes], out: Path, pattern: re.Pattern[str], timeout_s: float,
                    fail: Callable[[str], NoReturn] = pytest.fail) -> re.Match[str]:
    """Poll the inner run's output for ``pattern``; ``fail`` with its output if it exits or time runs out.

    The deadline is generous on purpose: it bounds a hung run, it is not a speed target."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = pattern.search(out.read_text(errors="replace"))
        if found:
            return found
        if proc.poll() is not None or time.monotonic() > deadline:
            fail(f"the inner run never printed {pattern.pattern!r} (exit {proc.poll()}):\n"
                 f"{out.read_text(errors='replace')[-3000:]}")
        time.sleep(0.05)
