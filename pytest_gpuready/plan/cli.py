"""``python -m pytest_gpuready plan MODEL_DIR ...`` and the ``gpuready`` console script.

A thin shell over :func:`~pytest_gpuready.plan.planner.plan_layouts`: parse the options, read the
model (config-only directories work) and the GPUs (a host's probe or a preset), print the plan,
optionally write the deploy file. Bad input is one line on stderr and exit 2; a host that cannot
be probed is one line and exit 3. Exit 0 when at least one layout works, 1 when none does.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from pytest_gpuready.errors import ConfigError, GpuReadyError
from pytest_gpuready.host.hosts import connect
from pytest_gpuready.host.probe import snapshot as probe_snapshot
from pytest_gpuready.model import serve_args
from pytest_gpuready.model.backends import parse_gpu_arch
from pytest_gpuready.model.serve_args import ServeArgs
from pytest_gpuready.model.spec import inspect_model
from pytest_gpuready.model.vllm_version import parse_vllm_version
from pytest_gpuready.outputs import OutputRefused, check_output, written_to
from pytest_gpuready.plan.deploy_writer import deploy_document, write_deploy
from pytest_gpuready.plan.planner import plan_layouts, planned_gpus
from pytest_gpuready.plan.presets import parse_gpus, preset_snapshot
from pytest_gpuready.plan.table import format_table


def _arch(text: str) -> tuple[int, int]:
    try:
        return parse_gpu_arch(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="gpuready", description="pytest-gpuready tools")
    commands = top.add_subparsers(dest="command", required=True)
    plan = commands.add_parser("plan", help="list every TP/PP/DP/EP and KV-dtype layout, best first")
    plan.add_argument("model_dir", metavar="MODEL_DIR",
                      help="model directory: a checkpoint, or only config.json (+ index, hf_quant_config.json)")
    where = plan.add_mutually_exclusive_group()
    where.add_argument("--gpu-host", metavar="HOST", help="probe this host's GPUs and topology (ssh or 'local')")
    where.add_argument("--gpus", metavar="NxNAME", help="plan on presets, e.g. 8xH100-80GB, 8xRTX-PRO-6000")
    plan.add_argument("--gpu-arch", metavar="SM", type=_arch,
                      help="the GPUs' compute capability (sm90, 8.6) where the probe does not report it")
    plan.add_argument("--vllm-version", metavar="V", help="the vLLM whose rules apply (default: newest)")
    engine = plan.add_argument_group("serve arguments (every row's; --kv-cache-dtype tries only that KV dtype)")
    serve_args.add_arguments(engine)
    plan.add_argument("--write-deploy", metavar="FILE", help="write the best working layouts as a deploy file")
    plan.add_argument("--choose", metavar="N", type=int, default=1,
                      help="how many working layouts --write-deploy writes (default 1, the best)")
    plan.add_argument("--commands", action="store_true",
                      help="print the vllm serve command of every row (default: the best 3 that work)")
    return top


def main(argv: Sequence[str] | None = None) -> int:
    try:
        code = _plan(argv)
        sys.stdout.flush()  # here, not at exit, so a reader that left is caught below
        return code
    except BrokenPipeError:
        # `gpuready plan ... | head`: the reader left; say nothing more (no traceback at exit either).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def _plan(argv: Sequence[str] | None) -> int:
    args = parser().parse_args(argv)
    try:
        version = parse_vllm_version(args.vllm_version) if args.vllm_version else None
    except ValueError as exc:
        print(f"gpuready plan: --vllm-version: {exc}", file=sys.stderr)
        return 2
    try:  # judged before the plan is made, as pytest judges --gpuready-report before any test
        deploy_output = check_output(args.write_deploy, what="deploy file") if args.write_deploy else None
    except OutputRefused as exc:
        print(f"gpuready plan: --write-deploy {exc}", file=sys.stderr)
        return 2
    try:
        model = inspect_model(args.model_dir)
        if args.gpus:
            count, preset = parse_gpus(args.gpus)
            snap = preset_snapshot(count, preset)
        else:
            host = connect(args.gpu_host or "local")
            snap = probe_snapshot(host)
            snap.require_gpus()
    except ConfigError as exc:
        print(f"gpuready plan: {exc}", file=sys.stderr)
        return 2
    except GpuReadyError as exc:
        print(f"gpuready plan: {exc}; pass --gpus 8xH100-80GB to plan on presets", file=sys.stderr)
        return 3
    given = serve_args.from_namespace(args)
    kv = given.pop("kv_cache_dtype", None)
    serve = ServeArgs(**given)
    allow_long = os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "").lower() in ("1", "true")
    try:
        rows = plan_layouts(model, snap, model_path=args.model_dir, vllm_version=version, serve=serve,
                            capability=args.gpu_arch, allow_long_max_model_len=allow_long,
                            kv_cache_dtypes=[kv] if kv is not None else None)
    except ConfigError as exc:  # weights that cannot be sized (a broken index, an unreadable shard)
        print(f"gpuready plan: {exc}", file=sys.stderr)
        return 2
    note = (f"rules: vLLM {version}" if version else
            "rules: newest (vLLM version unknown; pass --vllm-version)")
    _, cut = planned_gpus(snap)
    if cut is not None:
        note += f"\n{cut}"
    print(format_table(rows, model, snap.host, note, all_commands=args.commands))
    working = [row for row in rows if row.ok]
    if deploy_output is not None:
        if not working:
            print(f"gpuready plan: no layout works; {args.write_deploy} not written", file=sys.stderr)
            return 1
        chosen = working[:max(1, args.choose)]
        try:
            write_deploy(deploy_output, deploy_document(
                model.name, args.model_dir, chosen, capability=chosen[0].capability, version=version))
        except OutputRefused as exc:
            print(f"gpuready plan: --write-deploy {exc}", file=sys.stderr)
            return 2
        print(f"\nwrote {min(len(working), max(1, args.choose))} deployment(s) to {written_to(deploy_output)}")
    return 0 if working else 1
