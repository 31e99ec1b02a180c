"""Check pytest-gpuready as a user gets it: built sdist and wheel, the wheel installed (not editable).

    python scripts/check_installed.py --build DIST_DIR   (tox -e wheel-py3XX: a fresh venv)

With ``--build`` it first builds the sdist and the wheel into DIST_DIR (``python -m build``, the wheel
from the sdist, as pip builds it), runs ``twine check --strict`` on both, and installs the wheel
(not editable) into the running Python's venv; without it, DIST_DIR's wheel must be installed already.

Every test in the project's own suite runs against the editable checkout, where a module or data
file left out of the wheel cannot be noticed (0.1.0's wheel lacked ``model/rules``: every non-editable
install failed at collection). So this script checks, from outside the source tree:

1. the wheel holds every file of the source package (modules and data: ``py.typed``, the report's
   JSON Schema) and the sdist the files a user reads (README, LICENSE, CHANGELOG);
2. the metadata: the version is the source's, the licence an SPDX expression with its file;
3. every installed module imports, from a folder outside the checkout, and from site-packages;
4. the README's main command, the planner's example, ``pytest --markers``, ``pytest --help`` and
   ``gpuready --help`` give what the README says, run by the installed console scripts.

Exit 0 when all hold; otherwise each failure on one line and exit 1.
"""

from __future__ import annotations

import email.parser
import re
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "pytest_gpuready"
SDIST_MUST_HOLD = ("README.md", "LICENSE", "CHANGELOG.md", "pyproject.toml")
# The README's main command: it exits 1 on this deploy file on purpose (two failures kept in it).
MAIN_COMMAND = ("--pyargs", "pytest_gpuready.preflight", "--gpuready-config", "examples/deploy.yaml", "-rs")
PLAN_COMMAND = (
    "plan", "examples/models/MiniMax-M2.5", "--gpus", "8xRTX-PRO-6000",
    "--vllm-version", "0.17.0", "--max-model-len", "196608",
)  # fmt: skip
# Modules of an optional extra (imported only when it is installed): their absence is no failure.
OPTIONAL_EXTRAS = ("xdist", "matplotlib")
MARKERS_EXPECTED = ("@pytest.mark.deployment", "@pytest.mark.fp8_block_alignment", "@pytest.mark.gpus_clean")


def source_files() -> set[str]:
    """Every file of the source package a wheel must carry, as wheel-relative paths."""
    base = ROOT / PACKAGE
    return {
        str(p.relative_to(ROOT))
        for p in base.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in {".pyc", ".pyo"}
    }


def source_version() -> str:
    text = (ROOT / PACKAGE / "__init__.py").read_text()
    match = re.search(r'^__version__ = "([^"]+)"', text, re.MULTILINE)
    if match is None:
        raise SystemExit(f"{ROOT / PACKAGE / '__init__.py'}: no __version__ line")
    return match.group(1)


def check_wheel(wheel: Path, failures: list[str]) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        missing = sorted(source_files() - names)
        failures.extend(f"{wheel.name}: lacks {name} (in the source tree)" for name in missing)
        metadata_name = next((n for n in names if n.endswith(".dist-info/METADATA")), None)
        if metadata_name is None:
            failures.append(f"{wheel.name}: no METADATA")
            return
        meta = email.parser.Parser().parsestr(zf.read(metadata_name).decode())
        license_files = [n for n in names if ".dist-info/licenses/" in n]
    if meta["Version"] != source_version():
        failures.append(f"{wheel.name}: version {meta['Version']}, the source says {source_version()}")
    if meta["License-Expression"] != "Apache-2.0":
        failures.append(f"{wheel.name}: License-Expression {meta['License-Expression']!r}, expected 'Apache-2.0'")
    if not any(n.endswith("/LICENSE") for n in license_files):
        failures.append(f"{wheel.name}: no LICENSE under .dist-info/licenses/")


def check_sdist(sdist: Path, failures: list[str]) -> None:
    with tarfile.open(sdist) as tf:
        top = {Path(m.name).parts[1] if len(Path(m.name).parts) > 1 else "" for m in tf.getmembers()}
        names = {"/".join(Path(m.name).parts[1:]) for m in tf.getmembers()}
    failures.extend(f"{sdist.name}: lacks {name}" for name in SDIST_MUST_HOLD if name not in top)
    failures.extend(f"{sdist.name}: lacks {name} (in the source tree)" for name in sorted(source_files() - names))


def run(argv: Sequence[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True, timeout=300, check=False)


def check_imports(failures: list[str]) -> None:
    """Import every installed module from a folder outside the checkout, so the tree cannot shadow it."""
    script = (
        f"import importlib, pkgutil, sys, pytest_gpuready as p\nOPTIONAL = {OPTIONAL_EXTRAS!r}\n"
        "print(p.__file__)\n"
        "for m in pkgutil.walk_packages(p.__path__, 'pytest_gpuready.'):\n"
        "    if m.name.endswith('.__main__'):\n"
        "        continue\n"
        "    try:\n"
        "        importlib.import_module(m.name)\n"
        "    except ImportError as e:\n"
        "        if getattr(e, 'name', None) not in OPTIONAL:\n"
        "            print(f'IMPORT-FAILED {m.name}: {e}')\n"
    )
    with tempfile.TemporaryDirectory() as outside:
        result = run([sys.executable, "-c", script], Path(outside))
    if result.returncode != 0:
        failures.append(f"importing the installed package failed: {result.stderr.strip().splitlines()[-1:]}")
        return
    lines = result.stdout.splitlines()
    site = sysconfig.get_paths()["purelib"]
    if not lines or not lines[0].startswith(site):
        failures.append(f"pytest_gpuready imported from {lines[:1]}, not from this venv's {site}")
    failures.extend(line.removeprefix("IMPORT-FAILED ") for line in lines if line.startswith("IMPORT-FAILED "))


def script(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def check_commands(failures: list[str]) -> None:
    main = run([script("pytest"), *MAIN_COMMAND, "-p", "no:cacheprovider"], ROOT)
    closing = main.stdout.strip().splitlines()[-1:] or ["(no output)"]
    if main.returncode != 1 or " failed" not in closing[0] or " error" in closing[0]:
        failures.append(f"README main command: exit {main.returncode} (expected 1, failures only), {closing[0]}")
    if "site-packages/pytest_gpuready/preflight/" not in main.stdout:
        failures.append("README main command: the suite did not run from the installed package")
    plan = run([script("gpuready"), *PLAN_COMMAND], ROOT)
    if plan.returncode != 0 or not plan.stdout.startswith("plan: MiniMax-M2.5"):
        failures.append(f"planner example: exit {plan.returncode}, {(plan.stderr or plan.stdout).strip()[:200]}")
    markers = run([script("pytest"), "--markers", "-p", "no:cacheprovider"], Path(tempfile.gettempdir()))
    failures.extend(f"pytest --markers lacks {m}" for m in MARKERS_EXPECTED if m not in markers.stdout)
    helped = run([script("pytest"), "--help", "-p", "no:cacheprovider"], Path(tempfile.gettempdir()))
    if "--gpu-host" not in helped.stdout or "gpuready" not in helped.stdout:
        failures.append("pytest --help shows no gpuready options")
    cli = run([script("gpuready"), "--help"], Path(tempfile.gettempdir()))
    if cli.returncode != 0:
        failures.append(f"gpuready --help: exit {cli.returncode}: {cli.stderr.strip()[:200]}")


def build_and_install(dist: Path) -> None:
    """Build sdist and wheel into an emptied DIST, check both with twine, install the wheel here."""
    dist.mkdir(parents=True, exist_ok=True)
    for old in dist.iterdir():
        old.unlink()
    subprocess.run(
        [sys.executable, "-m", "build", "--quiet", "--outdir", str(dist), str(ROOT)], check=True, timeout=600
    )
    built = sorted(str(p) for p in dist.iterdir())
    subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *built], check=True, timeout=120)
    wheels = [p for p in built if p.endswith(".whl")]
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--force-reinstall", *wheels], check=True, timeout=600
    )


def main(argv: Sequence[str]) -> int:
    build = argv[:1] == ["--build"]
    if build:
        argv = argv[1:]
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    dist = Path(argv[0])
    if build:
        build_and_install(dist)
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        print(f"{dist}: expected one wheel and one sdist, found {len(wheels)} and {len(sdists)}", file=sys.stderr)
        return 1
    failures: list[str] = []
    check_wheel(wheels[0], failures)
    check_sdist(sdists[0], failures)
    check_imports(failures)
    check_commands(failures)
    for failure in failures:
        print(f"check_installed: {failure}", file=sys.stderr)
    if not failures:
        print(
            f"check_installed: {wheels[0].name} and {sdists[0].name} hold the package;"
            " installed, it runs as the README says"
        )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
