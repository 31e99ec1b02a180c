"""Under pytest-xdist (the ``fleet`` extra): every test of one host runs on one worker.

Why not xdist's own ``--dist loadgroup`` with an ``xdist_group`` mark per host: with pytest
9.2 and pytest-xdist 3.8 it groups nothing, silently. Its workers tag each grouped test by
rewriting ``item._nodeid``, and pytest 9.2 derives ``nodeid`` from a structured id instead
(pytest-dev/pytest-xdist#1386; the fix, PR #1388, is not merged, and the maintainers want the
groups sent apart from the ids). So the groups travel on their own here:

1. the controller gives each worker a directory through ``workerinput`` (``pytest_configure_node``);
2. each worker, after collection, writes ``{nodeid: group}`` there: ``host:NAME`` for a test of
   a host (:func:`pytest_gpuready.plugin.fleet.host_of_item`), ``xdist_group:NAME`` for a test
   the user marked with ``xdist_group`` (so those are grouped too, as loadgroup promises);
3. the controller's :class:`~pytest_gpuready.plugin.xdist_scheduler.HostGroupScheduling` (made by
   ``pytest_xdist_make_scheduler``) reads it and hands each group to one worker as one unit;
   tests of no group are spread one by one.

The scheduler takes over ``--dist loadgroup`` and ``--dist load`` (what ``-n`` alone means), with
named hosts or the default one (this machine), so ``pytest -n auto`` never runs two workers
against one host. Other ``--dist`` modes are left as the user chose them.

These hooks are registered only when xdist is installed (pytest's documented deferred-plugin
pattern); xdist itself is imported only by the scheduler module, when xdist asks for one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from pytest_gpuready.plugin.fleet import host_of_item

GROUPS_DIR_KEY = "gpuready_groups_dir"
"""The ``workerinput`` key naming the directory where workers leave their groups."""
TAKEN_OVER = ("loadgroup", "load")
_DIR_KEY = pytest.StashKey[str]()


def group_of(item: pytest.Item) -> str | None:
    """``host:NAME`` for a test of a host, ``xdist_group:NAME`` for one the user grouped, else None."""
    host = host_of_item(item)
    if host is not None:
        return f"host:{host}"
    names = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                    for mark in item.iter_markers("xdist_group")})
    return f"xdist_group:{'_'.join(names)}" if names else None


def scheduler_wanted(config: pytest.Config) -> bool:
    """Whether this run's ``--dist`` mode is scheduled by host (see the module docstring).

    ``--dist load`` is taken over whether or not a host was named: the default host (this
    machine) has GPUs too, and two workers each starting a ``vllm_server`` on it would share them.
    Tests of no host are units of their own, so they still spread as with ``--dist load``.
    """
    return config.getoption("dist", default="no") in TAKEN_OVER


class XdistHooks:
    """The xdist hooks of the plugin, registered by :func:`register` only when xdist is present."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    # controller side

    def pytest_configure_node(self, node: Any) -> None:
        directory = self.config.stash.get(_DIR_KEY, None)
        if directory is None:
            directory = tempfile.mkdtemp(prefix="gpuready-xdist-")
            self.config.stash[_DIR_KEY] = directory
        node.workerinput[GROUPS_DIR_KEY] = directory

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        if not scheduler_wanted(config):
            return None
        from pytest_gpuready.plugin.xdist_scheduler import HostGroupScheduling

        return HostGroupScheduling(config, log, groups_dir=config.stash.get(_DIR_KEY, None))

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        if hasattr(config, "workerinput") or not scheduler_wanted(config):
            return []
        return ["gpuready: xdist runs each host's tests on one worker (HostGroupScheduling; --dist "
                f"{config.getoption('dist')})"]

    # worker side

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
        if workerinput is None or GROUPS_DIR_KEY not in workerinput:
            return
        groups = {item.nodeid: group for item in items if (group := group_of(item)) is not None}
        directory = Path(workerinput[GROUPS_DIR_KEY])
        if not directory.is_dir():
            return  # a worker on another machine: the scheduler falls back to the ids (see there)
        worker = str(workerinput.get("workerid", os.getpid()))
        partial = directory / f".{worker}.json.tmp"
        partial.write_text(json.dumps(groups))
        partial.replace(directory / f"{worker}.json")  # whole or absent when the controller reads it


_NAME = "gpuready-xdist"


def pytest_configure(config: pytest.Config) -> None:
    register(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    unregister(config)


def register(config: pytest.Config) -> None:
    """Register :class:`XdistHooks` when pytest-xdist is installed (a no-op otherwise)."""
    if config.pluginmanager.hasplugin("xdist") and config.pluginmanager.get_plugin(_NAME) is None:
        config.pluginmanager.register(XdistHooks(config), _NAME)


def unregister(config: pytest.Config) -> None:
    """Unregister the hooks and remove the controller's groups directory."""
    directory = config.stash.get(_DIR_KEY, None)
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)
    plugin = config.pluginmanager.get_plugin(_NAME)
    if plugin is not None:
        config.pluginmanager.unregister(plugin)
