"""The result of one invariant check: pass or fail, a one-line summary, and the evidence.

Checks are pure functions that return a :class:`Verdict`; the plugin turns it into a test
outcome. Keeping the result as data (rather than raising) lets the same check feed a test
failure, a JUnit property, a JSON report and a library caller alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Verdict:
    """Outcome of a check.

    ``summary`` is one line; ``details`` are the lines an engineer reads to act (one per dirty GPU,
    per leftover file, per misaligned layer); ``evidence`` holds the measured values as plain data
    for reports; ``warnings`` are passing-but-thin findings (headroom, topology) that the plugin
    shows without failing; ``rule_set`` names the vLLM rules applied, where they depend on version.
    ``needs`` is set on a verdict that could not decide: it names the input that would decide it
    (the GPU's compute capability, say). Such a verdict is never ok, and the plugin skips with it.
    """

    ok: bool
    summary: str
    details: tuple[str, ...] = ()
    evidence: Mapping[str, Any] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    rule_set: str | None = None
    needs: str | None = None

    def __bool__(self) -> bool:
        return self.ok

    @property
    def message(self) -> str:
        """Summary and details as the multi-line text shown in a test failure."""
        lines = [self.summary, *(f"  {line}" for line in self.details)]
        if self.needs:
            lines.append(f"  needs: {self.needs}")
        if self.rule_set:
            lines.append(f"  (rules: {self.rule_set})")
        return "\n".join(lines)

    @classmethod
    def passed(cls, summary: str, **kwargs: Any) -> Verdict:
        return cls(True, summary, **kwargs)

    @classmethod
    def failed(cls, summary: str, **kwargs: Any) -> Verdict:
        return cls(False, summary, **kwargs)

    @classmethod
    def undecided(cls, summary: str, needs: str, **kwargs: Any) -> Verdict:
        """A check that cannot decide without ``needs``: not a pass, and says what to give it."""
        return cls(False, summary, needs=needs, **kwargs)
