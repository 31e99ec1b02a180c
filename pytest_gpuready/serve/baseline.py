"""Stored baselines of serving benchmarks: per level, the rounds measured and the key that makes them comparable.

A baseline from another GPU, driver, vLLM version, model, serve setting or workload is no
baseline, so every stored level carries its :class:`ComparabilityKey` and a comparison with a key
that differs is refused in one line naming the part (pytest-benchmark only warns).

A level keeps the rounds of several runs (the newest :data:`MAX_RUNS_KEPT`): the spread between
runs of an unchanged server is what a new run is judged against (:mod:`.spread`), and one run
cannot show it. The file is plain JSON (``format``, ``version``, ``levels``: id -> ``{key, runs:
[{samples, saved, clock_events}]}``), written whole through a temporary file and renamed, so a
reader never sees half of one; a version-1 file (one run per level) is read as one run.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path, PurePath
from typing import Any

from pytest_gpuready import files
from pytest_gpuready.errors import ConfigError, GpuReadyError
from pytest_gpuready.host.hosts import Host
from pytest_gpuready.serve.spec import ServeSpec, command_words

FORMAT = "pytest-gpuready-baseline"
VERSION = 2
READABLE_VERSIONS = (1, 2)
MAX_RUNS_KEPT = 10
"""Runs a level keeps; saving an eleventh drops the oldest (a window that follows the deployment)."""


def check_min_runs(value: object, what: str = "") -> int:
    """``min_runs`` as ``--gpuready-baseline-min-runs`` and ``expect_no_regression`` take it: a whole
    number from 1 to the runs a level keeps (more could never be reached)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_RUNS_KEPT:
        prefix = f"{what}: " if what else ""
        raise ValueError(f"{prefix}expected a whole number from 1 to {MAX_RUNS_KEPT} (the runs a baseline keeps)")
    return value
MAX_BASELINE_BYTES = 64 * 1024 * 1024
MAX_CONFIG_BYTES = 4 * 1024 * 1024

def serve_args_record(spec: ServeSpec) -> dict[str, Any]:
    """The serve arguments a baseline is keyed on, as the deployment declaration records them.

    :meth:`ServeArgs.to_record` (every modelled field by name, vLLM's defaults included, and the
    flags not judged), plus the flags written into the launch command itself (``--enforce-eager``
    in ``python -m vllm.entrypoints.openai.api_server --enforce-eager``) and the spec's environment.
    Not the program, the model (the key's model fields name it), port, bind address or served name:
    they change nothing measured.
    """
    words = command_words(spec)
    first_flag = next((i for i, w in enumerate(words) if w.startswith("--")), len(words))
    flags: list[str] = []
    skip = False
    for word in words[first_flag:]:
        if skip:
            skip = False
            continue
        if word == "--model":
            skip = True
            continue
        if word != spec.model and not word.startswith("--model="):
            flags.append(word)
    record = spec.args.to_record()
    record["command_flags"] = flags
    record["env"] = {k: v for k, v in sorted(spec.env.items()) if k != "CUDA_VISIBLE_DEVICES"}
    return record


def model_config_sha256(path: str, host: Host) -> str:
    """sha256 of the model's ``config.json`` as canonical JSON (sorted keys): formatting does not count."""
    config_path = str(PurePath(path) / "config.json")
    if host.is_local:
        text = files.read_text_bounded(config_path, MAX_CONFIG_BYTES, "model config")
    else:
        result = host.run(f"head -c {MAX_CONFIG_BYTES + 1} {shlex.quote(config_path)}", timeout=30)
        if result.returncode != 0:
            raise ConfigError(f"{host.name}:{config_path}: not readable: {result.stderr.strip()[:200]}")
        if len(result.stdout.encode()) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{host.name}:{config_path}: larger than {MAX_CONFIG_BYTES} bytes")
        text = result.stdout
    parsed = files.loads_json(text, config_path)
    canonical = json.dumps(parsed, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class ComparabilityKey:
    """Everything that must match for two measurements of a level to be compared."""

    gpu_model: str
    gpu_count: int
    driver: str | None
    vllm_version: str | None
    model_name: str
    model_config_sha256: str
    serve_args: Mapping[str, Any]
    """:func:`serve_args_record`: field name -> value."""
    concurrency: int
    prompt_tokens: int
    output_tokens: int
    requests: int

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["serve_args"] = json.loads(json.dumps(dict(self.serve_args)))  # plain data: tuples as lists
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ComparabilityKey:
        names = [f.name for f in fields(cls)]
        missing = [name for name in names if name not in data]
        if missing:
            raise ValueError(f"key lacks {', '.join(missing)}")
        values = {name: data[name] for name in names}
        if not isinstance(data["serve_args"], Mapping):
            raise ValueError("key serve_args: expected an object of serve argument -> value")
        values["serve_args"] = json.loads(json.dumps(dict(data["serve_args"])))
        return cls(**values)


_PART_NAMES = {
    "gpu_model": "GPU model", "gpu_count": "GPU count", "driver": "driver", "vllm_version": "vLLM version",
    "model_name": "model", "model_config_sha256": "model config (sha256 of config.json)",
    "serve_args": "serve arguments", "concurrency": "concurrency", "prompt_tokens": "prompt tokens",
    "output_tokens": "output tokens", "requests": "request count",
}


def _shown(value: object) -> str:
    if isinstance(value, (list, tuple)):
        return shlex.join(str(v) for v in value) if value else "(none)"
    return "none" if value is None else str(value)


def key_difference(baseline: ComparabilityKey, now: ComparabilityKey) -> str | None:
    """``vLLM version differs (baseline 0.31.0, now 0.32.0)``: the first part that differs, or None."""
    for item in fields(ComparabilityKey):
        old, new = getattr(baseline, item.name), getattr(now, item.name)
        if item.name == "serve_args":
            old, new = json.loads(json.dumps(dict(old))), json.loads(json.dumps(dict(new)))
        if old == new:
            continue
        if item.name == "serve_args":
            for name in [*old, *(n for n in new if n not in old)]:
                if old.get(name, "(absent)") != new.get(name, "(absent)"):
                    return (f"serve arguments differ ({name}: baseline {_shown(old.get(name, '(absent)'))}, "
                            f"now {_shown(new.get(name, '(absent)'))})")
        if item.name == "model_config_sha256":
            return f"{_PART_NAMES[item.name]} differs (baseline {str(old)[:12]}, now {str(new)[:12]})"
        return f"{_PART_NAMES[item.name]} differs (baseline {_shown(old)}, now {_shown(new)})"
    return None


def level_id(test: str, server: str, concurrency: int, occurrence: int = 1) -> str:
    """``tests/test_x.py::test_tp4 | MiniMax-M2.5, TP=4 | c8``: one stored level (``#2``... for a
    second benchmark of the same server in one test)."""
    suffix = f" #{occurrence}" if occurrence > 1 else ""
    return f"{test} | {server}{suffix} | c{concurrency}"


@dataclass(frozen=True)
class StoredRun:
    """One saved run of a level: every metric's value in each of its rounds."""

    samples: Mapping[str, Sequence[float]]
    """Metric name -> its value in each round (:func:`pytest_gpuready.serve.compare.samples_of`)."""
    saved: str
    clock_events: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"samples": {k: list(v) for k, v in self.samples.items()}, "saved": self.saved,
                "clock_events": dict(self.clock_events) if self.clock_events else None}


@dataclass(frozen=True)
class StoredLevel:
    """One level of a baseline file: its key and its runs, oldest first."""

    key: ComparabilityKey
    runs: tuple[StoredRun, ...]

    @property
    def samples(self) -> list[Mapping[str, Sequence[float]]]:
        """Each run's samples, oldest first (what :func:`~pytest_gpuready.serve.compare.compare_samples` takes)."""
        return [run.samples for run in self.runs]

    def pooled(self) -> dict[str, list[float]]:
        """Every run's rounds together, per metric (the plot's band)."""
        pooled: dict[str, list[float]] = {}
        for run in self.runs:
            for name, values in run.samples.items():
                pooled.setdefault(name, []).extend(values)
        return pooled

    def with_run(self, key: ComparabilityKey, run: StoredRun, keep: int = MAX_RUNS_KEPT) -> StoredLevel:
        """This level with ``run`` added (the oldest dropped past ``keep``); a new key starts over."""
        if key_difference(self.key, key) is not None:
            return StoredLevel(key, (run,))
        return StoredLevel(key, (*self.runs, run)[-keep:])

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key.to_dict(), "runs": [run.to_dict() for run in self.runs]}


class BaselineFileError(GpuReadyError):
    """The baseline file cannot be read as one."""


def _run(level: str, data: Any, where: str) -> StoredRun:
    if not isinstance(data, Mapping):
        raise BaselineFileError(f"{where}: level {level!r}: runs: expected a list of objects")
    samples = data.get("samples")
    if not isinstance(samples, Mapping) or not all(
            isinstance(v, list) and v and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                              and math.isfinite(x) for x in v)
            for v in samples.values()):
        raise BaselineFileError(f"{where}: level {level!r}: samples: expected metric -> list of numbers")
    events = data.get("clock_events")
    return StoredRun({str(k): [float(x) for x in v] for k, v in samples.items()}, str(data.get("saved", "")),
                     events if isinstance(events, Mapping) else None)


def _stored(level: str, data: Any, where: str, version: int) -> StoredLevel:
    if not isinstance(data, Mapping):
        raise BaselineFileError(f"{where}: level {level!r}: expected an object")
    try:
        key = ComparabilityKey.from_dict(data.get("key") or {})
    except (TypeError, ValueError) as exc:
        raise BaselineFileError(f"{where}: level {level!r}: {exc}") from None
    if version == 1:  # one run per level, its fields beside the key
        return StoredLevel(key, (_run(level, data, where),))
    runs = data.get("runs")
    if not isinstance(runs, list) or not runs:
        raise BaselineFileError(f"{where}: level {level!r}: runs: expected a list of one or more runs")
    return StoredLevel(key, tuple(_run(level, run, where) for run in runs[-MAX_RUNS_KEPT:]))


def load(path: Path) -> dict[str, StoredLevel]:
    """The levels of the baseline file at ``path``; :class:`BaselineFileError` naming what is wrong."""
    where = str(path)
    try:
        text = files.read_text_bounded(path, MAX_BASELINE_BYTES, "baseline file")
        data = files.loads_json(text, where)
    except ConfigError as exc:
        raise BaselineFileError(str(exc)) from None
    if not isinstance(data, Mapping) or data.get("format") != FORMAT:
        raise BaselineFileError(f"{where}: not a pytest-gpuready baseline (expected \"format\": \"{FORMAT}\")")
    version = data.get("version")
    if version not in READABLE_VERSIONS or isinstance(version, bool):
        raise BaselineFileError(f"{where}: baseline version {version!r}: this plugin reads versions "
                                f"{', '.join(map(str, READABLE_VERSIONS))}")
    levels = data.get("levels")
    if not isinstance(levels, Mapping):
        raise BaselineFileError(f"{where}: levels: expected an object of level id -> level")
    return {str(level): _stored(str(level), entry, where, int(version)) for level, entry in levels.items()}


def save(path: Path, levels: Mapping[str, StoredLevel]) -> None:
    """Write ``levels`` to ``path`` (whole, through a temporary file renamed over it)."""
    document = {"format": FORMAT, "version": VERSION,
                "levels": {level: stored.to_dict() for level, stored in sorted(levels.items())}}
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(document, indent=1) + "\n")
    partial.replace(path)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


__all__ = [
    "FORMAT",
    "MAX_RUNS_KEPT",
    "READABLE_VERSIONS",
    "VERSION",
    "BaselineFileError",
    "ComparabilityKey",
    "StoredLevel",
    "StoredRun",
    "check_min_runs",
    "key_difference",
    "level_id",
    "load",
    "model_config_sha256",
    "now_iso",
    "save",
    "serve_args_record",
]
