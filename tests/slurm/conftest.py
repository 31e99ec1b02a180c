"""The slurm tier: a real one-node Slurm cluster (tests/slurm_cluster.py), once per session.

Where Slurm is not installed (or the tests do not run as root) the tier skips with the install
command as the reason; in CI (``CI=true``), where ``.ci/run`` installs it, that is a failure
naming the cause instead: a tier that silently skips in CI tests nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.slurm_cluster import SlurmCluster, SlurmUnavailable, slurm_cluster


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def cluster() -> Iterator[SlurmCluster]:
    """A real slurmctld + slurmd (+ munged) on a private configuration; stopped at the end of the session."""
    try:
        with slurm_cluster() as running:
            yield running
    except SlurmUnavailable as exc:
        if _in_ci():
            pytest.fail(f"the slurm tier must run in CI: {exc}")
        pytest.skip(str(exc))


@pytest.fixture
def node(cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The cluster with its node idle and clean before the test, and put back so after it."""
    cluster.enable("health", False)
    cluster.enable("epilog", False)
    cluster.use_scenario("h200-idle")
    cluster.resume()
    yield cluster
    cluster.enable("health", False)
    cluster.enable("epilog", False)
    cluster.use_scenario("h200-idle")
    cluster.resume()
