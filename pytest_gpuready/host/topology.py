"""Parsing ``nvidia-smi topo -m``: the link between each GPU pair, and each GPU's CPU/NUMA affinity.

The matrix is tab-separated but not tab-aligned (real outputs put two tabs before the
``GPU NUMA ID`` column, and the header is underlined with ANSI escapes), so the matrix cells
are read by position and the affinity cells as the non-empty cells that follow.
"""

from __future__ import annotations

import re

from pytest_gpuready.errors import ProbeError
from pytest_gpuready.host.snapshot import GpuLink, Topology

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_GPU_NAME = re.compile(r"^GPU(\d+)$")
_CELL_SEPARATOR = re.compile(r"\t| {2,}")
"""nvidia-smi separates cells with tabs; copies pasted from terminals carry runs of spaces."""
_LINK = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")


def parse_topo_matrix(text: str, host: str = "host") -> Topology:
    """Parse the output of ``nvidia-smi topo -m``."""
    lines = [_ANSI.sub("", line).rstrip("\n") for line in text.splitlines()]
    header_index = next(
        (i for i, line in enumerate(lines) if "GPU0" in line and "CPU Affinity" in line), None
    )
    if header_index is None:
        raise ProbeError(f"{host}: nvidia-smi topo -m printed no GPU matrix: {text.strip()[:120]!r}")
    columns = [cell.strip() for cell in _CELL_SEPARATOR.split(lines[header_index]) if cell.strip()]
    matrix_columns = [c for c in columns if c not in ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")]
    links: list[GpuLink] = []
    cpu_affinity: dict[int, str] = {}
    numa_affinity: dict[int, int | None] = {}
    for line in lines[header_index + 1:]:
        cells = _CELL_SEPARATOR.split(line)
        name_match = _GPU_NAME.match(cells[0].strip()) if cells else None
        if name_match is None:
            if line.strip().startswith("Legend"):
                break
            continue
        gpu = int(name_match.group(1))
        values = [cell.strip() for cell in cells[1:]]
        if len(values) < len(matrix_columns):
            raise ProbeError(f"{host}: nvidia-smi topo -m row for GPU{gpu} is truncated: {line.strip()!r}")
        for column, cell in zip(matrix_columns, values[: len(matrix_columns)], strict=True):
            peer = _GPU_NAME.match(column)
            if peer is None:
                continue  # a NIC column
            if not _LINK.match(cell):
                raise ProbeError(f"{host}: nvidia-smi topo -m: unknown link {cell!r} between GPU{gpu} and {column}")
            peer_index = int(peer.group(1))
            if peer_index > gpu:
                links.append(GpuLink(gpu, peer_index, cell))
        rest = [cell for cell in values[len(matrix_columns):] if cell]
        if rest:
            cpu_affinity[gpu] = rest[0]
        numa_affinity[gpu] = int(rest[1]) if len(rest) > 1 and rest[1].isdigit() else None
    if not cpu_affinity and not numa_affinity and not links:
        raise ProbeError(f"{host}: nvidia-smi topo -m listed no GPU rows")
    return Topology(tuple(links), cpu_affinity, numa_affinity)
