"""The xdist scheduler that hands every test of one host (or one ``xdist_group``) to one worker.

Imported only from ``pytest_xdist_make_scheduler`` (so only when xdist runs); see
:mod:`pytest_gpuready.plugin.xdist_groups` for why it exists and where its groups come from.
It is xdist's ``LoadScopeScheduling`` with the scope of a test looked up instead of cut from its
id: a group is one work unit, run whole by one worker, and the biggest units go first; a test
of no group is a unit of its own, so those spread over the workers as with ``--dist load``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

from pytest_gpuready.plugin.host_session import get_host_registry


def read_groups(directory: str) -> dict[str, str]:
    """The groups the workers wrote (every worker collects the same tests, so they agree)."""
    groups: dict[str, str] = {}
    for path in sorted(Path(directory).glob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict):
            groups.update({str(k): str(v) for k, v in data.items()})
    return groups


class HostGroupScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist ships no type information
    """One work unit per host (and per ``xdist_group``); every other test on its own."""

    def __init__(self, config: pytest.Config, log: Any = None, *, groups_dir: str | None = None) -> None:
        super().__init__(config, log)
        self.groups_dir = groups_dir
        self._groups: dict[str, str] | None = None
        self._hosts = tuple(get_host_registry(config)) if get_host_registry(config).is_fleet else ()

    @property
    def groups(self) -> dict[str, str]:
        """``{nodeid: group}`` as the workers wrote it, read once (after every worker has collected)."""
        if self._groups is None:
            self._groups = read_groups(self.groups_dir) if self.groups_dir is not None else {}
            self.log(f"gpuready: {len(set(self._groups.values()))} groups over {len(self._groups)} tests")
        return self._groups

    def _split_scope(self, nodeid: str) -> str:
        group = self.groups.get(nodeid)
        if group is not None:
            return group
        if not self.groups:
            # No worker could write its groups (workers on other machines): with several hosts the
            # host is still in the test id, last; with one host, no id says which tests are its.
            for name in self._hosts:
                if nodeid.endswith((f"[{name}]", f"-{name}]")):
                    return f"host:{name}"
        return nodeid
