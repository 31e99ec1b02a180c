"""``--write-deploy FILE``: the chosen layouts as deploy-file entries the preflight then runs."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

import yaml

from pytest_gpuready.model.backends import format_arch
from pytest_gpuready.model.serve_args import DEPLOYMENT, SERVE
from pytest_gpuready.model.vllm_version import VllmVersion
from pytest_gpuready.outputs import Output, write_output
from pytest_gpuready.plan.planner import LayoutRow


def deployment_name(model_name: str, row: LayoutRow) -> str:
    layout = row.layout
    name = (f"{model_name}-" + (f"dp{layout.dp}-" if layout.dp > 1 else "") + f"tp{layout.tp}"
            + (f"-pp{layout.pp}" if layout.pp > 1 else ""))
    name += "-ep" if layout.ep else ""
    name += "" if layout.kv_cache_dtype == "auto" else f"-kv{layout.kv_cache_dtype}"
    return re.sub(r"[^A-Za-z0-9._-]", "-", name).lstrip("-._") or "model"


def deploy_document(model_name: str, model_path: str, rows: Sequence[LayoutRow], *,
                    capability: tuple[int, int] | None, version: VllmVersion | None) -> dict[str, Any]:
    """The rows as deploy-file entries: each row's serve arguments as the declaration writes them
    (:meth:`ServeArgs.deploy_entry`), so the file reads back into the same arguments."""
    defaults: dict[str, Any] = {}
    if capability is not None:
        defaults["gpu_arch"] = format_arch(capability).lower()
    if version is not None:
        defaults["vllm_version"] = str(version)
    deployments = []
    for row in rows:
        keys = row.args.deploy_entry()
        entry: dict[str, Any] = {
            "name": deployment_name(model_name, row),
            "description": f"planned by `gpuready plan`: {row.layout.describe()}, {row.locality}",
            "model": os.path.abspath(model_path), "gpus": list(row.gpus), "tp": row.layout.tp,
            **keys[DEPLOYMENT], "serve": keys[SERVE]}
        deployments.append(entry)
    document: dict[str, Any] = {}
    if defaults:
        document["defaults"] = defaults
    document["deployments"] = deployments
    return document


def write_deploy(output: Output, document: dict[str, Any]) -> None:
    """Write the deploy file as every output is written (:mod:`pytest_gpuready.outputs`): whole or not at all."""
    header = ("# Written by `python -m pytest_gpuready plan --write-deploy`; check it with\n"
              f"#   pytest --pyargs pytest_gpuready.preflight --gpuready-config {output.shown} -rs\n")
    write_output(output, header + yaml.safe_dump(document, sort_keys=False))
