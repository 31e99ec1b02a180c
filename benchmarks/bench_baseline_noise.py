"""Benchmark: how often does the baseline rule call an unchanged server regressed, and does it catch a slower one?

One real vLLM server is started with :class:`VLLMServer`; a baseline is saved from it
(``--gpuready-baseline-save``); then ``--runs`` further gate runs against the same, unchanged
server each compare with that baseline under the default rule (10% and p < 0.002, 7 rounds a
level). Every level any of them calls regressed, undecided or invalid is a false alarm. Then the
three behaviours of the vllm tier on this machine: a baseline of another vLLM version and one of
another model are refused; the same spec launched with ``--max-num-seqs 1`` (attached under the
unchanged declaration) is caught at the level where it is slower and not at concurrency 1.

Each gate is a pytest process of its own (tests/baseline_runs.py). Needs vLLM:

    .venv-vllm/bin/python benchmarks/bench_baseline_noise.py --runs 10 [--model DIR] [--vllm-args ...]
    (on the H200: scripts/ of this repo, see docs/performance.md#baseline-false-alarms)
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from pytest_gpuready import LocalHost, ServeSpec, VLLMServer  # noqa: E402
from pytest_gpuready.model.serve_args import ServeArgs  # noqa: E402
from tests.baseline_runs import GateRun, run_gate  # noqa: E402
from tests.tiny_model import SERVED_NAME, write_tiny_llama  # noqa: E402

PASS = ("ok", "improved")


def summary_of(run: GateRun) -> dict[str, Any]:
    levels = {}
    for level in run.levels:
        head = next((m for m in level.get("metrics") or [] if m["metric"] == "output_tok_s"), None)
        levels[str(level["concurrency"])] = {
            "verdict": level["verdict"], "reason": level["reason"],
            "output_tok_s_change": head["change"] if head else None,
            "output_tok_s_p": head["p_value"] if head else None,
            "output_tok_s_median": head["now"] if head else None,
            "metrics_not_ok": [f"{m['metric']}: {m['verdict']}" for m in level.get("metrics") or []
                               if m["verdict"] not in PASS],
            "clock_events": level.get("clock_events"),
        }
    return {"returncode": run.returncode, "levels": levels}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="unchanged runs compared with the baseline")
    parser.add_argument("--model", help="model directory (default: the tiny Llama of tests/tiny_model.py)")
    parser.add_argument("--vllm-args", default="", help="extra launch flags, e.g. '--enforce-eager'")
    parser.add_argument("--levels", default="1,16")
    parser.add_argument("--requests", default="8,32", help="requests per round at each level")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--json", type=Path, help="write every run's verdicts here")
    parser.add_argument("--restart", action="store_true",
                        help="a fresh server for every unchanged run (as CI has: each gate the first after a start)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="gpuready-baseline-"))
    model = args.model or str(write_tiny_llama(work / "tiny-llama"))
    command = " ".join([shlex.quote(sys.executable), "-m", "vllm.entrypoints.openai.api_server",
                        args.vllm_args]).strip()
    spec = ServeSpec(model=model, served_model_name=SERVED_NAME, args=ServeArgs(max_model_len=args.max_model_len),
                     command=command,
                     env={"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"})
    levels = [int(x) for x in args.levels.split(",")]
    requests = dict(zip(levels, (int(x) for x in args.requests.split(",")), strict=True))
    workload: dict[str, Any] = {"concurrency": levels, "prompt_tokens": args.prompt_tokens,
                                "output_tokens": args.output_tokens, "requests": requests, "warmup": 2}
    baseline = work / "baseline.json"
    results: dict[str, Any] = {"spec": spec.to_dict(), "workload": workload, "runs": []}
    began = time.monotonic()

    server = VLLMServer(spec, LocalHost(), log_dir=work / "logs")
    server.start()
    try:
        save = run_gate(work, server.url, spec, baseline, "--gpuready-baseline-save", workload=workload, name="save")
        results["save"] = summary_of(save)
        print(f"saved baseline: rc={save.returncode} {save.verdicts()}", flush=True)
        if save.returncode != 0:
            print(save.output[-3000:])
        for index in range(args.runs):
            if args.restart:
                server.stop()
                server = VLLMServer(spec, LocalHost(), log_dir=work / f"logs-{index}")
                server.start()
            run = run_gate(work, server.url, spec, baseline, workload=workload, name=f"run{index}")
            results["runs"].append(summary_of(run))
            line = ", ".join(f"c{c}: {v['verdict']} {v['output_tok_s_change']:+.1%} p={v['output_tok_s_p']:.2g}"
                             if v["output_tok_s_change"] is not None else f"c{c}: {v['verdict']}"
                             for c, v in results["runs"][-1]["levels"].items())
            print(f"unchanged run {index + 1}/{args.runs}: rc={run.returncode} {line}", flush=True)
            if args.json:
                args.json.write_text(json.dumps(results, indent=1) + "\n")
        stored = json.loads(baseline.read_text())
        for level in stored["levels"].values():
            level["key"]["vllm_version"] = "0.24.0"
        other_version = work / "other-version.json"
        other_version.write_text(json.dumps(stored))
        refused = run_gate(work, server.url, spec, other_version, workload=workload, name="version")
        results["other_vllm_version"] = summary_of(refused)
        print(f"baseline of vLLM 0.24.0: rc={refused.returncode} "
              f"{[v['reason'] for v in results['other_vllm_version']['levels'].values()]}", flush=True)
        other_model = work / "other-model"
        other_model.mkdir()
        config = json.loads((Path(model) / "config.json").read_text())
        config["num_hidden_layers"] = int(config["num_hidden_layers"]) + 1
        (other_model / "config.json").write_text(json.dumps(config))
        refused = run_gate(work, server.url, replace(spec, model=str(other_model)), baseline, workload=workload,
                           name="model")
        results["other_model"] = summary_of(refused)
        print(f"baseline of another model: rc={refused.returncode} "
              f"{[v['reason'] for v in results['other_model']['levels'].values()]}", flush=True)
    finally:
        server.stop()
    slower = VLLMServer(replace(spec, args=replace(spec.args, max_num_seqs=1)), LocalHost(), log_dir=work / "logs-slow")
    slower.start()
    try:
        run = run_gate(work, slower.url, spec, baseline, workload=workload, name="slower")
        results["max_num_seqs_1"] = summary_of(run)
        caught = [(c, v["verdict"], v["output_tok_s_change"]) for c, v in results["max_num_seqs_1"]["levels"].items()]
        print(f"--max-num-seqs 1: rc={run.returncode} {caught}", flush=True)
    finally:
        slower.stop()
    alarms = [(i, c, v["verdict"]) for i, r in enumerate(results["runs"]) for c, v in r["levels"].items()
              if v["verdict"] not in PASS]
    compared = sum(len(r["levels"]) for r in results["runs"])
    results["false_alarms"] = {"levels_compared": compared, "false_alarms": len(alarms), "which": alarms}
    results["elapsed_s"] = round(time.monotonic() - began, 1)
    print(f"false alarms: {len(alarms)} of {compared} unchanged levels ({args.runs} runs x {len(levels)} levels); "
          f"{results['elapsed_s']} s", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
