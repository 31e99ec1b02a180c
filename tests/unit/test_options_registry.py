"""The registries of options (plugin/options.py) and markers (plugin/markers.py) are the one truth:
``--help``, ``--markers``, the README and every docs page agree with them, or this fails saying
what to write."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from pytest_gpuready.plugin import markers, model_fixtures, options
from pytest_gpuready.plugin.settings import GROUP_NAME, Setting, setting

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BY_FLAG = {s.flag: s for s in options.ALL_SETTINGS}
HEADER = "| option | env | ini | default |"
NOT_OPTIONS = {  # variables of the test tiers and the stand-in, not of the plugin
    "GPUREADY_LIFECYCLE_PHASES", "GPUREADY_LIFECYCLE_VLLM_TESTS", "GPUREADY_RULES_ON_REAL_GPU",
    "GPUREADY_VLLM_TIER_ARGS", "GPUREADY_STANDIN_SCENARIO",
}


def _row(cells: tuple[str, ...]) -> str:
    return "| " + " | ".join(cells) + " |"


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def _prose(page: Path) -> str:
    """A page without its fenced code blocks (examples call markers; they do not declare them)."""
    return re.sub(r"```.*?```", "", page.read_text(), flags=re.S)


def expected_readme_table() -> str:
    return "\n".join([HEADER, "|---|---|---|---|", *(_row(s.doc_cells()) for s in options.ALL_SETTINGS)])


def test_names_derive_from_one_name() -> None:
    made = setting("gpu_min_power_w", int, 0, "help")
    assert (made.dest, made.flag, made.env, made.ini) == (
        "gpu_min_power_w", "--gpu-min-power-w", "GPUREADY_GPU_MIN_POWER_W", "gpu_min_power_w")
    repeatable = setting("ssh_options", str, "", "help", multiple=True)
    assert (repeatable.flag, repeatable.env, repeatable.ini) == ("--ssh-option", "GPUREADY_SSH_OPTIONS", "ssh_options")
    prefixed = setting("gpuready_config", str, "", "help")
    assert (prefixed.flag, prefixed.env) == ("--gpuready-config", "GPUREADY_CONFIG")


def test_every_name_is_derived_but_two_kept_for_users() -> None:
    """Only ``$GPUREADY_HOST`` and ``$GPUREADY_HOSTS_FILE`` break the rule (users set them before it)."""
    differing = {s.dest for s in options.ALL_SETTINGS
                 if (s.flag, s.env, s.ini) != (lambda d: (d.flag, d.env, d.ini))(
                     setting(s.dest, s.parse, s.default, s.help, multiple=s.multiple))}
    assert differing == {"gpu_host", "gpu_hosts_file"}
    assert len({s.flag for s in options.ALL_SETTINGS}) == len({s.env for s in options.ALL_SETTINGS}) \
        == len(options.ALL_SETTINGS) == 29


def test_every_option_of_the_group_is_declared_in_the_registry(pytester: pytest.Pytester) -> None:
    """An option added in the old style (a Setting spelled by hand in a fixture module) fails here."""
    pytester.makeconftest(f"""
        import pytest

        @pytest.hookimpl(trylast=True)
        def pytest_addoption(parser):
            group = parser.getgroup({GROUP_NAME!r})
            print("FLAGS", " ".join(sorted(n for o in group.options for n in o.names())))
    """)
    result = pytester.runpytest("--co", "-q", "-s")
    line = next(line for line in result.outlines if line.startswith("FLAGS "))
    assert set(line.split()[1:]) == set(BY_FLAG)


def test_the_readme_options_table_is_the_registry() -> None:
    """One table, no blank line inside, every option once, in the registry's order and words."""
    text = (ROOT / "README.md").read_text()
    start = text.index(HEADER)
    block = "\n".join(line for line in text[start:].split("\n\n", 1)[0].splitlines())
    expected = expected_readme_table()
    assert block == expected, f"the README's options table should read:\n{expected}"


def test_every_option_table_in_the_docs_agrees_with_the_registry() -> None:
    checked = 0
    for page in PAGES:
        lines = page.read_text().splitlines()
        for index, line in enumerate(lines):
            if not line.startswith("| option | env | ini |"):
                continue
            with_default = line.strip() == HEADER
            for row in lines[index + 2:]:
                if not row.startswith("|"):
                    break
                cells = _cells(row)
                flag = cells[0].strip("`").split(" ")[0].rstrip("`")
                if flag not in BY_FLAG:
                    assert cells[1:3] == ["", ""], f"{page.name}: {row!r} names no option of the registry"
                    continue
                want = BY_FLAG[flag].doc_cells()
                if with_default:
                    assert tuple(cells[:4]) == want, f"{page.name}: {row!r} should read {_row(want)}"
                else:  # a table that says what each does: the option's own words may follow its spelling
                    spelt = want[0].split("`")[1]
                    assert cells[0].startswith(f"`{spelt}`"), f"{page.name}: {row!r} should spell `{spelt}`"
                    assert ("(repeatable)" in cells[0]) == BY_FLAG[flag].multiple, f"{page.name}: {row!r}"
                    assert tuple(cells[1:3]) == want[1:3], f"{page.name}: {row!r} should name {want[1:3]}"
                checked += 1
    assert checked >= len(options.ALL_SETTINGS) + 10  # the README's table and the pages' own


def test_every_variable_and_ini_key_the_docs_name_is_the_options() -> None:
    envs = {s.env for s in options.ALL_SETTINGS}
    for page in PAGES:
        text = page.read_text()
        unknown = set(re.findall(r"\bGPUREADY_[A-Z_]+\b", text)) - envs - NOT_OPTIONS
        assert not unknown, f"{page.name} names variables no option has: {sorted(unknown)}"
        for flag, env, ini in re.findall(r"`(--[a-z-]+)[^`]*` \(env `([A-Z_]+)`, ini `([a-z_]+)`", text):
            declared = BY_FLAG[flag]
            assert (env, ini) == (declared.env, declared.ini), f"{page.name}: {flag} is {declared.env}/{declared.ini}"


def _is_declaration(arguments: str, line: str, page: Path) -> bool:
    """A signature, not a call: in a page's header line or the README's table, or with a bare name, ``*`` or None."""
    if line.startswith(("**Marker**", "**Fixture**")) or (page.name == "README.md" and line.startswith("| ")):
        return True
    parts = [part.strip() for part in arguments.split(",") if part.strip()]
    return any("=" not in part or part.endswith("=None") for part in parts)


def test_every_marker_signature_in_the_docs_is_the_python_one() -> None:
    """Declarations equal the Python signature; calls (``gpu_p2p(tp=2)``) name only its parameters."""
    names = "|".join(m.name for m in markers.ALL_MARKERS)
    seen: set[str] = set()
    for page in PAGES:
        for line in _prose(page).splitlines():
            for span, name, arguments in re.findall(rf"`(?:@pytest\.mark\.)?(({names})\(([^`]*)\))`", line):
                declared = markers.BY_NAME[name]
                if _is_declaration(arguments, line, page):
                    assert span == declared.signature_text, (
                        f"{page.name}: `{span}` should read `{declared.signature_text}`")
                    seen.add(name)
                else:
                    given = {part.split("=", 1)[0].strip() for part in arguments.split(",") if part.strip()}
                    assert given <= set(declared.parameters), f"{page.name}: `{span}`: {declared.parameters}"
    assert seen == {m.name for m in markers.ALL_MARKERS if m.signature.parameters}


def test_the_readme_table_lists_every_marker() -> None:
    table = (ROOT / "README.md").read_text().split("## Fixtures, markers and checks", 1)[1].split("\n## ", 1)[0]
    missing = [m.signature_text for m in markers.ALL_MARKERS
               if m.signature.parameters and f"`{m.signature_text}`" not in table]
    assert not missing, f"the README's table of fixtures and markers lacks {missing}"


def test_memory_fit_takes_what_the_check_takes() -> None:
    """The marker's arguments go to memory_fit_verdict as they are: same names, same defaults."""
    check = inspect.signature(model_fixtures.memory_fit_verdict).parameters
    for name, parameter in markers.memory_fit.signature.parameters.items():
        assert name in check, name
        assert parameter.default == check[name].default, name


@pytest.mark.parametrize(("declared", "verdict"), [
    (markers.gpu_p2p, "gpu_p2p_verdict"), (markers.nccl_allreduce, "nccl_allreduce_verdict"),
    (markers.gpu_health, "gpu_health_verdict")])
def test_the_gpu_markers_take_what_their_checks_take(declared: markers.Marker, verdict: str) -> None:
    from pytest_gpuready.plugin import health_fixtures, two_gpu_fixtures

    module = two_gpu_fixtures if hasattr(two_gpu_fixtures, verdict) else health_fixtures
    check = inspect.signature(getattr(module, verdict)).parameters
    for name, parameter in declared.signature.parameters.items():
        assert name in check, name
        assert parameter.default == check[name].default, name


def test_a_marker_line_is_its_signature_and_first_paragraph() -> None:
    assert markers.fp8_block_alignment.signature_text == \
        "fp8_block_alignment(tp, ep=False, *, vllm_version=None, gpu_arch=None)"
    assert markers.gpuready.line.startswith("gpuready: a GPU-readiness preflight check")
    assert markers.HOST_BOUND_MARKERS == ("gpus_clean", "shm_clean", "gpu_health", "model", "deployment",
                                          "fp8_block_alignment", "mla_kv_backend_supported", "memory_fit")


def test_doc_cells_escape_the_table_separator() -> None:
    cells = options.GPU_READER.doc_cells()
    assert cells[0] == "`--gpu-reader auto\\|nvml\\|nvidia-smi`"
    assert isinstance(options.GPU_READER, Setting)
