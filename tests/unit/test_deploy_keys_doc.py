"""The deploy-file page's table of serve-argument keys is the declaration's (``ServeArgs``).

The table between the ``serve-args`` markers of docs/checks/deploy_config.md is rendered here from
:data:`pytest_gpuready.model.serve_args.ARGS`; a field added, renamed, moved or re-typed without the
page (or the page edited alone) fails, and the message carries the table to paste.
"""

from __future__ import annotations

import re
from pathlib import Path

from pytest_gpuready.model.deploy_config import DEPLOYMENT_KEYS, SERVE_KEYS
from pytest_gpuready.model.serve_args import ARGS, DEPLOYMENT, SERVE, keys

PAGE = Path(__file__).resolve().parents[2] / "docs" / "checks" / "deploy_config.md"
BLOCK = re.compile(r"<!-- serve-args:begin[^>]*-->\n(.*?)<!-- serve-args:end -->", re.DOTALL)


def rendered() -> str:
    """The table as the declaration has it: one row per field, in declaration order."""
    rows = ["| key | vLLM's key | flag | where | value |", "|---|---|---|---|---|"]
    for name, arg in ARGS.items():
        flag = f"`{arg.flag}`" + (f" (`{arg.short}`)" if arg.short else "")
        where = "top level" if arg.section == DEPLOYMENT else "`serve:`"
        rows.append(f"| `{name}` | `{arg.vllm_name}` | {flag} | {where} | {arg.expected} |")
    return "\n".join(rows) + "\n"


def test_the_pages_key_table_is_the_declaration() -> None:
    [shown] = BLOCK.findall(PAGE.read_text())
    expected = rendered()
    assert shown == expected, f"docs/checks/deploy_config.md's serve-args table is stale; it should read:\n{expected}"


def test_the_loader_takes_exactly_the_declared_keys() -> None:
    """What the table lists is what the loader accepts where the table says (and nothing lost)."""
    assert set(keys(DEPLOYMENT)) <= set(DEPLOYMENT_KEYS)
    assert set(keys(SERVE)) <= set(SERVE_KEYS)
    assert set(keys(DEPLOYMENT)) | set(keys(SERVE)) == set(ARGS)
    assert not set(keys(SERVE)) & set(DEPLOYMENT_KEYS)


def test_the_serve_spec_pages_example_prints_what_it_shows() -> None:
    """docs/serve_spec.md's example, run: each expression's value is the one its comment shows."""
    import ast

    page = PAGE.parent.parent / "serve_spec.md"
    [block] = re.findall(r"```python\n(.*?)```", page.read_text(), re.DOTALL)[:1]
    statements: list[str] = []
    shown: list[tuple[str, str]] = []
    previous_was_comment = False
    for line in block.splitlines():
        if line.startswith("# "):
            if previous_was_comment:
                shown[-1] = (shown[-1][0], shown[-1][1] + line[2:])
            else:  # the comment shows the value of the expression on the line above
                shown.append((statements.pop(), line[2:]))
            previous_was_comment = True
        else:
            statements.append(line)
            previous_was_comment = False
    namespace: dict[str, object] = {}
    exec("\n".join(statements), namespace)  # the page's code, as a user pastes it
    assert len(shown) == 3
    for expression, text in shown:
        assert eval(expression, namespace) == ast.literal_eval(text), expression
