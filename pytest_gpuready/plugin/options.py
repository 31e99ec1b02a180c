"""Every option of the plugin, declared once: the registry the flags, variables, ini keys and docs derive from.

One :func:`~pytest_gpuready.plugin.settings.setting` per option, from one name: ``gpu_ids`` is
the flag ``--gpu-ids``, the environment variable ``GPUREADY_GPU_IDS`` and the ini key
``gpu_ids`` (the rules are in :func:`~pytest_gpuready.plugin.settings.setting`). The tuples at the
end say which plugin module registers each (``HOST_SETTINGS`` from ``host_fixtures``, ...), and
:data:`ALL_SETTINGS` is every one of them.

To add an option:

1. one declaration here, in the tuple of the module that reads it::

       GPU_MIN_POWER_W = setting("gpu_min_power_w", s.parse_non_negative_int, 0,
                                 "Power a GPU must be able to draw (default 0).", metavar="WATTS")

   (``parse`` raises ValueError saying what was expected; a repeatable option is
   ``multiple=True``, a switch ``is_flag=True``; ``shown_default`` when the default reads better
   in words);
2. read it with ``GPU_MIN_POWER_W.get(config)`` where it is used;
3. add its row to the README's options table: ``tests/unit/test_options_registry.py`` fails
   with the row to paste until the README and every docs table that names it agree with this
   module, and fails on an option of the ``gpuready`` group that is not declared here.

Nothing here reads a value: this module only declares.
"""

from __future__ import annotations

import contextlib
from typing import Any

from pytest_gpuready.host.checks import DEFAULT_MAX_USED_MIB, DEFAULT_SHM_MIN_FREE_MIB
from pytest_gpuready.host.hosts import HostSpec
from pytest_gpuready.host.probe import DEFAULT_PROBE_TIMEOUT_S, READERS
from pytest_gpuready.host.shm import LEAK_PATTERNS
from pytest_gpuready.model.backends import parse_gpu_arch
from pytest_gpuready.model.vllm_version import VllmVersion, parse_vllm_version
from pytest_gpuready.plugin import settings as s
from pytest_gpuready.plugin.settings import Setting, setting
from pytest_gpuready.serve.baseline import MAX_RUNS_KEPT, check_min_runs
from pytest_gpuready.serve.compare import DEFAULT_MIN_RUNS, METRIC_BY_NAME, parse_tolerances

# ---------------------------------------------------------------- hosts (host_fixtures)

GPU_HOST: Setting[tuple[HostSpec, ...] | None] = setting(
    "gpu_host", s.parse_hosts, None,
    "GPU host to check: local (default), host, user@host or ssh://user@host:port. Repeat it for "
    "several hosts (env/ini: one a line); host-bound tests then run once per host.",
    metavar="HOST", multiple=True, env="GPUREADY_HOST", shown_default="`local`")
GPU_HOSTS_FILE = setting(
    "gpu_hosts_file", s.parse_optional_str, None,
    "File of GPU hosts, one host spec a line (# comments, blank lines allowed); added after --gpu-host.",
    metavar="FILE", env="GPUREADY_HOSTS_FILE")
GPU_IDS = setting(
    "gpu_ids", s.parse_gpu_ids, None, "GPUs to check, by index (default: all).",
    metavar="0,1,2,3", shown_default="all")
GPU_MAX_USED_MIB = setting(
    "gpu_max_used_mib", s.parse_non_negative_int, DEFAULT_MAX_USED_MIB,
    f"Memory a GPU may show used and still count as clean (default {DEFAULT_MAX_USED_MIB}).", metavar="MIB")
GPU_READER = setting(
    "gpu_reader", s.parse_choice(*READERS), "auto",
    "How to read local GPUs: auto (NVML, else nvidia-smi), nvml or nvidia-smi. Remote hosts always use nvidia-smi.",
    metavar="|".join(READERS))
GPU_PROBE_TIMEOUT = setting(
    "gpu_probe_timeout", s.parse_positive_float, DEFAULT_PROBE_TIMEOUT_S,
    f"Seconds each part of a host probe (an nvidia-smi query, the /dev/shm listing) may take; one that "
    f"has not answered is killed with what it started, on the host too, and named in the error "
    f"(default {DEFAULT_PROBE_TIMEOUT_S:g}).", metavar="SECONDS")
SSH_IDENTITY = setting(
    "ssh_identity", s.parse_optional_str, None, "Identity (private key) file for ssh, as ssh -i.",
    metavar="PATH", shown_default="ssh's own")
SSH_OPTIONS: Setting[tuple[str, ...]] = setting(
    "ssh_options", s.parse_ssh_options, (),
    "Extra ssh option as Key=Value, as ssh -o (repeatable; env/ini: one per line).",
    metavar="KEY=VALUE", multiple=True)
SSH_CONNECT_TIMEOUT = setting(
    "ssh_connect_timeout", s.parse_positive_float, 10.0, "Seconds to wait for an ssh connection (default 10).",
    metavar="SECONDS")
SHM_MIN_FREE_MIB = setting(
    "shm_min_free_mib", s.parse_non_negative_int, DEFAULT_SHM_MIN_FREE_MIB,
    f"Free space /dev/shm must have (default {DEFAULT_SHM_MIN_FREE_MIB}).", metavar="MIB")
SHM_LEAK_PATTERNS: Setting[tuple[str, ...]] = setting(
    "shm_leak_patterns", s.parse_leak_patterns, LEAK_PATTERNS,
    f"/dev/shm names that count as leftovers when no process holds them (repeatable; env/ini one a line; "
    f"default {', '.join(LEAK_PATTERNS)}). Narrowing them narrows what --shm-remove-leftovers may remove.",
    metavar="GLOB", multiple=True, shown_default=", ".join(f"`{p}`" for p in LEAK_PATTERNS))
SHM_REMOVE_LEFTOVERS = setting(
    "shm_remove_leftovers", s.parse_bool, False,
    "Remove /dev/shm leftovers that no live process holds, and say what was removed (default: remove nothing).",
    is_flag=True)
GPU_REAP_ORPHANS = setting(
    "gpu_reap_orphans", s.parse_bool, False,
    "Before the GPU checks, stop orphaned vLLM engines (VLLM::EngineCore / VLLM::Worker whose owner is gone: "
    "parent pid 1 or a subreaper; an engine with a live parent is a running job, never signalled) that hold "
    "GPU memory: SIGTERM, then SIGKILL, each re-checked on the host right before; says what it stopped and "
    "what it left running (default: stop nothing).",
    is_flag=True)

# ---------------------------------------------------------------- two-GPU checks (two_gpu_fixtures)

GPU_WORKER_PYTHON = setting(
    "gpu_worker_python", s.parse_python, "python3",
    "The Python on the GPU host that has torch, for the gpu_p2p and nccl_allreduce markers (default python3; "
    "e.g. the vLLM venv's /opt/vllm/bin/python).",
    metavar="PYTHON", shown_default="`python3` (the GPU host's Python with torch, for `gpu_p2p` / `nccl_allreduce`)")

# ---------------------------------------------------------------- models (model_fixtures)

GPUREADY_CONFIG = setting(
    "gpuready_config", s.parse_optional_str, None,
    "Deploy file (YAML) naming deployments: model, GPUs, TP/EP, KV dtype, serve args, expectations.",
    metavar="FILE")
GPUREADY_MODEL = setting(
    "gpuready_model", s.parse_optional_str, None,
    "Model directory the model_spec fixture reads (here, or on --gpu-host when it is not here).",
    metavar="PATH")
VLLM_VERSION: Setting[VllmVersion | None] = setting(
    "vllm_version", s.expecting(parse_vllm_version, "expected a vLLM version like 0.17.0 or 0.11.0rc2"), None,
    "vLLM version whose load rules apply (default: the GPU host's installed vllm, else the newest rules).",
    metavar="VERSION", shown_default="the host's installed vLLM, else the newest rules")
GPU_ARCH: Setting[tuple[int, int] | None] = setting(
    "gpu_arch", s.expecting(parse_gpu_arch, "expected sm90, sm100, sm120 or a compute capability like 12.0"),
    None,
    "GPU architecture for the MLA backend check when no GPU host is reachable: sm90, sm100, sm120 or 12.0.",
    metavar="SM", shown_default="the GPU host's")

# ---------------------------------------------------------------- servers (server_fixtures)

VLLM_CMD: Setting[str | None] = setting(
    "vllm_cmd", s.parse_command, None,
    "Command that launches vLLM before the model (default 'vllm serve'; model placed after 'serve', "
    "else as --model, or at {model}), e.g. 'python -m vllm.entrypoints.openai.api_server'.",
    metavar="COMMAND", shown_default="`vllm serve`")
"""None: the ServeSpec's own command (``vllm serve``)."""
VLLM_READY_TIMEOUT = setting(
    "vllm_ready_timeout", s.parse_positive_float, 1800.0,
    "Seconds a launched vLLM server may take to become ready (default 1800; a 1T model loads in ~13 min).",
    metavar="SECONDS")
VLLM_URL = setting(
    "vllm_url", s.parse_url, None,
    "Attach to an already running vLLM server at this URL instead of launching one (never stopped).",
    metavar="URL", shown_default="none (launch)")

# ---------------------------------------------------------------- reports (report_collector)

GPUREADY_REPORT = setting(
    "gpuready_report", s.parse_optional_str, None,
    "Write the JSON report (hosts, snapshots, verdicts with evidence, servers, benchmarks, timings) to "
    "this file; its JSON Schema ships with the plugin (docs/report.md).",
    metavar="PATH")
GPUREADY_JSON = setting(
    "gpuready_json", s.parse_optional_str, None, "Deprecated name of --gpuready-report (the same document).",
    metavar="PATH", note="(deprecated name of `--gpuready-report`)")
GPUREADY_PLOT = setting(
    "gpuready_plot", s.parse_optional_str, None,
    "Save PNG plots (throughput and TTFT against concurrency, GPU memory per GPU) in this directory; "
    "needs the plot extra (matplotlib).",
    metavar="DIR", note="(the `plot` extra)")

# ---------------------------------------------------------------- baselines (baseline_fixtures)

def _parse_tolerances(text: str) -> dict[str, float] | None:
    return parse_tolerances(text) if text.strip() else None


def _parse_min_runs(text: str) -> int:
    value: object = text
    with contextlib.suppress(ValueError):
        value = int(text.strip())
    return check_min_runs(value)


GPUREADY_BASELINE = setting(
    "gpuready_baseline", s.parse_optional_str, None,
    "Compare every benchmark_serving level with the one stored in this JSON file (per test, server "
    "and concurrency, with the key that makes it comparable); docs/fixtures/benchmark_serving.md.",
    metavar="PATH")
GPUREADY_BASELINE_SAVE = setting(
    "gpuready_baseline_save", s.parse_bool, False,
    "Add this run's benchmark levels to the --gpuready-baseline file as one more run of each (the newest "
    f"{MAX_RUNS_KEPT} are kept; a level whose key changed starts over; a regressed or throttled level is not "
    "saved).",
    is_flag=True)
GPUREADY_BASELINE_MIN_RUNS = setting(
    "gpuready_baseline_min_runs", _parse_min_runs, DEFAULT_MIN_RUNS,
    "Saved runs a baseline level needs before a change beyond the tolerance is called a regression "
    "(fewer: undecided). From 3 the run-to-run spread is judged too; 1 or 2 accept the rank test over "
    "rounds alone.",
    metavar="N")
GPUREADY_COMPARE_FAIL = setting(
    "gpuready_compare_fail", _parse_tolerances, None,
    "Tolerance per metric before a level regresses, e.g. output_tok_s:5%,ttft_p99:20% (a bare 15% sets "
    "all; off records a metric without gating it; default 10% each). Metrics: " + ", ".join(METRIC_BY_NAME) + ".",
    metavar="METRIC:PERCENT,...", shown_default="10% per metric")
GPUREADY_GITHUB_BENCHMARK = setting(
    "gpuready_github_benchmark", s.parse_optional_str, None,
    "Write every benchmark level as github-action-benchmark JSON into this directory: "
    "bigger-is-better.json (tool customBiggerIsBetter) and smaller-is-better.json (customSmallerIsBetter).",
    metavar="DIR")

# ---------------------------------------------------------------- who registers what

HOST_SETTINGS: tuple[Setting[Any], ...] = (
    GPU_HOST, GPU_HOSTS_FILE, GPU_IDS, GPU_MAX_USED_MIB, GPU_READER, SSH_IDENTITY, SSH_OPTIONS, SSH_CONNECT_TIMEOUT,
    GPU_PROBE_TIMEOUT, SHM_MIN_FREE_MIB, SHM_LEAK_PATTERNS, SHM_REMOVE_LEFTOVERS, GPU_REAP_ORPHANS,
)
TWO_GPU_SETTINGS: tuple[Setting[Any], ...] = (GPU_WORKER_PYTHON,)
MODEL_SETTINGS: tuple[Setting[Any], ...] = (GPUREADY_MODEL, GPUREADY_CONFIG, VLLM_VERSION, GPU_ARCH)
SERVER_SETTINGS: tuple[Setting[Any], ...] = (VLLM_CMD, VLLM_READY_TIMEOUT, VLLM_URL)
REPORT_SETTINGS: tuple[Setting[Any], ...] = (GPUREADY_REPORT, GPUREADY_JSON, GPUREADY_PLOT)
BASELINE_SETTINGS: tuple[Setting[Any], ...] = (GPUREADY_BASELINE, GPUREADY_BASELINE_SAVE,
                                               GPUREADY_BASELINE_MIN_RUNS, GPUREADY_COMPARE_FAIL,
                                               GPUREADY_GITHUB_BENCHMARK)

ALL_SETTINGS: tuple[Setting[Any], ...] = (HOST_SETTINGS + TWO_GPU_SETTINGS + MODEL_SETTINGS + SERVER_SETTINGS
                                          + REPORT_SETTINGS + BASELINE_SETTINGS)
"""Every option, in the order of ``pytest --help`` and of the README's options table."""
