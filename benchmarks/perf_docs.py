"""What every benchmark needs to write its figures down: its own section of docs/performance.md.

Each benchmark owns one ``## `` section; rewriting it leaves the other benchmarks' sections as
they are, so the benchmarks can be re-run one at a time.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs" / "performance.md"


def replace_section(section: str, body: str, docs: Path = DOCS) -> None:
    """Put ``body`` (which starts with the ``section`` heading) in place of that section, or append it."""
    text = docs.read_text() if docs.exists() else "# Performance\n"
    start = text.find(section + "\n")
    if start == -1:
        text = text.rstrip("\n") + "\n\n" + body.rstrip("\n") + "\n"
    else:
        end = text.find("\n## ", start + len(section))
        text = text[:start] + body.rstrip("\n") + "\n" + (text[end:] if end != -1 else "")
    docs.parent.mkdir(parents=True, exist_ok=True)
    docs.write_text(text.rstrip("\n") + "\n")


def machine() -> str:
    """``2 cores, Python 3.11.7, OpenSSH_9.2p1 Debian-2+deb12u10``: the machine line of a section."""
    cpus = subprocess.run(["nproc"], capture_output=True, text=True, check=False).stdout.strip()
    ssh = subprocess.run(["ssh", "-V"], capture_output=True, text=True, check=False).stderr.strip()
    return f"{cpus} cores, Python {sys.version.split()[0]}, {ssh.split(',')[0]}"
