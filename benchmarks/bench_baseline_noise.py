"""Benchmark: how often does the baseline rule call an unchanged server regressed, and does it catch a slower one?

Every run is a gate as a main-branch CI job runs it: a pytest process of its own
(tests/baseline_runs.py) that benchmarks a real vLLM server, compares each level with the
baseline file and adds the run to it (``--gpuready-baseline-save``). With ``--restart`` every run
gets a server of its own, started fresh (as CI has it: each gate the first after a start);
without, one long-lived server serves them all. The first runs build the baseline (a level is
``undecided`` below 3 runs, and saved); every later run is compared with the runs before it, and
each level it calls anything but ``ok`` or ``improved`` is a false alarm: the server did not change.

The work folder keeps the baseline and every run (``results.json``), so the runs can be spread
over several calls (``--runs`` more each time, ``--budget-s`` stops starting runs that would not
finish). ``--finish`` then checks the two other behaviours on this machine: the same spec launched
with ``--max-num-seqs 1`` (attached under the unchanged declaration) against the baseline the runs
built, caught at the level where it is slower and not at concurrency 1; and a baseline of another
vLLM version refused.

``--replay results.json`` (no vLLM needed) judges the recorded runs again with the same pure rule
(:func:`pytest_gpuready.serve.compare.compare_samples`): each run against the runs before it (the
CI sequence), and each run against every choice of k other runs, for the false-alarm rate of the
rule over more baselines than one sequence gives.

    .venv-vllm/bin/python benchmarks/bench_baseline_noise.py --work DIR --runs 12 --restart [--model DIR]
    python benchmarks/bench_baseline_noise.py --replay DIR/results.json
    (on the H200: scripts/gpu-baseline.sh, docs/performance.md#baseline-false-alarms)
"""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from pytest_gpuready import LocalHost, ServeSpec, VLLMServer  # noqa: E402
from pytest_gpuready.model.serve_args import ServeArgs  # noqa: E402
from pytest_gpuready.serve.compare import compare_samples  # noqa: E402
from tests.baseline_runs import GateRun, run_gate  # noqa: E402
from tests.tiny_model import SERVED_NAME, write_tiny_llama  # noqa: E402

PASS = ("ok", "improved")
RUN_SECONDS_GUESS = 120.0
"""A run's length before one has been timed (start, warm-up and 7 rounds a level); then the longest seen."""


def summary_of(run: GateRun, seconds: float) -> dict[str, Any]:
    levels = {}
    for level in run.levels:
        head = next((m for m in level.get("metrics") or [] if m["metric"] == "output_tok_s"), None)
        levels[str(level["concurrency"])] = {
            "verdict": level["verdict"], "reason": level["reason"], "saved": level.get("saved"),
            "baseline_runs": level.get("baseline_runs"),
            "output_tok_s_change": head["change"] if head else None,
            "output_tok_s_p": head["p_value"] if head else None,
            "output_tok_s_run_p": head.get("run_p_value") if head else None,
            "output_tok_s_detectable": head.get("detectable") if head else None,
            "output_tok_s_median": head["now"] if head else None,
            "metrics_not_ok": [f"{m['metric']}: {m['verdict']}" + (f" ({m['note']})" if m.get('note') else '')
                               for m in level.get("metrics") or []
                               if m["verdict"] not in PASS],
            "samples": level.get("samples"),
            "clock_events": level.get("clock_events"),
        }
    return {"returncode": run.returncode, "seconds": round(seconds, 1), "levels": levels}


def line_of(summary: dict[str, Any]) -> str:
    parts = []
    for concurrency, level in summary["levels"].items():
        text = f"c{concurrency}: {level['verdict']}"
        if level["output_tok_s_median"] is not None:
            text += f" {level['output_tok_s_median']:.0f} tok/s"
        if level["output_tok_s_change"] is not None:
            text += f" ({level['output_tok_s_change']:+.1%} vs {level['baseline_runs']} runs"
            if level["output_tok_s_run_p"] is not None:
                text += f", spread p={level['output_tok_s_run_p']:.2g}"
            text += ")"
        if level["metrics_not_ok"]:
            text += f" [{'; '.join(level['metrics_not_ok'])}]"
        parts.append(text)
    return f"rc={summary['returncode']} {summary['seconds']} s " + ", ".join(parts)


def false_alarms(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Levels of unchanged runs compared with a baseline of 3 or more runs that did not pass."""
    judged = [(i, c, level) for i, run in enumerate(runs) for c, level in run["levels"].items()
              if (level.get("baseline_runs") or 0) >= 3]
    alarms = [(i + 1, c, level["verdict"], level["metrics_not_ok"]) for i, c, level in judged
              if level["verdict"] not in PASS]
    return {"levels_judged": len(judged), "false_alarms": len(alarms), "which": alarms,
            "runs_judged": len({i for i, _, _ in judged}), "runs_with_an_alarm": len({a[0] for a in alarms})}


def replay(results: dict[str, Any], choices: tuple[int, ...] = (1, 3, 5, 9)) -> dict[str, Any]:
    """The recorded unchanged runs judged again by the pure rule: the CI sequence (each run against
    up to 10 runs before it, from the fourth on), and each run against every choice of k others.
    k = 1 is judged with ``min_runs=1``: the rank test over rounds alone against one run, the
    rule of the first baseline gate (what the H200 false-alarmed on, docs/performance.md)."""
    runs = results["runs"]
    concurrencies = sorted({c for run in runs for c in run["levels"]}, key=int)

    def verdicts(baseline: list[int], now: int) -> dict[str, str]:
        out = {}
        min_runs = 1 if len(baseline) == 1 else 3
        for c in concurrencies:
            stored = [runs[i]["levels"][c]["samples"] for i in baseline if runs[i]["levels"].get(c, {}).get("samples")]
            current = runs[now]["levels"].get(c, {}).get("samples")
            if len(stored) < min_runs or not current:
                continue
            metrics = compare_samples(stored, current, min_runs=min_runs)
            worst = [m for m in metrics if m.verdict not in PASS]
            out[c] = worst[0].verdict if worst else "ok"
        return out

    report: dict[str, Any] = {}
    sequence = [verdicts(list(range(max(0, i - 10), i)), i) for i in range(3, len(runs))]
    levels = [v for run in sequence for v in run.values()]
    report["sequence"] = {"runs": len(sequence), "levels": len(levels),
                          "alarms": sum(1 for v in levels if v not in PASS),
                          "runs_with_an_alarm": sum(1 for run in sequence if any(v not in PASS for v in run.values()))}
    for k in choices:
        if len(runs) < k + 1:
            continue
        judged = alarms = runs_judged = runs_alarmed = 0
        for now in range(len(runs)):
            others = [i for i in range(len(runs)) if i != now]
            for baseline in itertools.combinations(others, k):
                got = verdicts(list(baseline), now)
                judged += len(got)
                alarms += sum(1 for v in got.values() if v not in PASS)
                runs_judged += 1
                runs_alarmed += any(v not in PASS for v in got.values())
        report[f"any_{k}_others"] = {"baselines": runs_judged, "levels": judged, "alarms": alarms,
                                     "level_rate": round(alarms / judged, 4) if judged else None,
                                     "run_rate": round(runs_alarmed / runs_judged, 4) if runs_judged else None}
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, help="folder kept between calls: baseline.json, results.json, logs")
    parser.add_argument("--runs", type=int, default=12, help="unchanged gate runs to add this call")
    parser.add_argument("--budget-s", type=float, default=None, help="start no run that would end past this")
    parser.add_argument("--finish", action="store_true", help="then the --max-num-seqs 1 and vLLM-version checks")
    parser.add_argument("--replay", type=Path, help="judge a results.json again (no vLLM needed) and stop")
    parser.add_argument("--model", help="model directory (default: the tiny Llama of tests/tiny_model.py)")
    parser.add_argument("--vllm-args", default="", help="extra launch flags, e.g. '--enforce-eager'")
    parser.add_argument("--levels", default="1,16")
    parser.add_argument("--requests", default="8,32", help="requests per round at each level")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--restart", action="store_true",
                        help="a fresh server for every run (as CI has: each gate the first after a start)")
    args = parser.parse_args()
    if args.replay:
        print(json.dumps(replay(json.loads(args.replay.read_text())), indent=1))
        return 0
    if args.work is None:
        parser.error("--work DIR is needed to run gates")
    began = time.monotonic()
    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)
    model = args.model or str(work / "tiny-llama")
    if not args.model and not (work / "tiny-llama" / "config.json").exists():
        write_tiny_llama(work / "tiny-llama")
    command = " ".join([shlex.quote(sys.executable), "-m", "vllm.entrypoints.openai.api_server",
                        args.vllm_args]).strip()
    spec = ServeSpec(model=model, served_model_name=SERVED_NAME, args=ServeArgs(max_model_len=args.max_model_len),
                     command=command, env={"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"})
    levels = [int(x) for x in args.levels.split(",")]
    requests = dict(zip(levels, (int(x) for x in args.requests.split(",")), strict=True))
    workload: dict[str, Any] = {"concurrency": levels, "prompt_tokens": args.prompt_tokens,
                                "output_tokens": args.output_tokens, "requests": requests, "warmup": 2}
    baseline = work / "baseline.json"
    results_path = work / "results.json"
    results: dict[str, Any] = json.loads(results_path.read_text()) if results_path.exists() else {
        "spec": spec.to_dict(), "workload": workload, "restart": args.restart, "runs": []}

    def write() -> None:
        results["false_alarms"] = false_alarms(results["runs"])
        results_path.write_text(json.dumps(results, indent=1) + "\n")

    def left() -> float:
        return float("inf") if args.budget_s is None else args.budget_s - (time.monotonic() - began)

    longest = max((run["seconds"] for run in results["runs"]), default=RUN_SECONDS_GUESS)
    server: VLLMServer | None = None
    try:
        for _ in range(args.runs):
            if left() < longest * 1.15:
                print(f"stopping: {left():.0f} s left, a run takes up to {longest:.0f} s", flush=True)
                break
            started = time.monotonic()
            index = len(results["runs"])
            if server is None or args.restart:
                if server is not None:
                    server.stop()
                server = VLLMServer(spec, LocalHost(), log_dir=work / f"logs-{index}")
                server.start()
            run = run_gate(work, server.url, spec, baseline, "--gpuready-baseline-save", workload=workload,
                           name=f"run{index}")
            if args.restart:
                server.stop()
                server = None
            summary = summary_of(run, time.monotonic() - started)
            results["runs"].append(summary)
            longest = max(run["seconds"] for run in results["runs"])  # the guess only until a run is timed
            print(f"unchanged run {index + 1}: {line_of(summary)}", flush=True)
            if run.returncode not in (0, 1):
                print(run.output[-3000:], flush=True)
            write()
        if args.finish:
            if server is not None:
                server.stop()
                server = None
            finish(work, spec, baseline, workload, results)
            write()
    finally:
        if server is not None:
            server.stop()
    alarms = results["false_alarms"] if "false_alarms" in results else false_alarms(results["runs"])
    print(f"false alarms: {alarms['false_alarms']} of {alarms['levels_judged']} unchanged levels judged against "
          f"3 or more runs ({alarms['runs_with_an_alarm']} of {alarms['runs_judged']} runs); "
          f"{time.monotonic() - began:.1f} s this call", flush=True)
    return 0


def finish(work: Path, spec: ServeSpec, baseline: Path, workload: dict[str, Any], results: dict[str, Any]) -> None:
    """The slower server caught where it is slower; a baseline of another vLLM version refused."""
    slower = VLLMServer(replace(spec, args=replace(spec.args, max_num_seqs=1)), LocalHost(), log_dir=work / "logs-slow")
    started = time.monotonic()
    slower.start()
    try:
        run = run_gate(work, slower.url, spec, baseline, workload=workload, name="slower")
        results["max_num_seqs_1"] = summary_of(run, time.monotonic() - started)
        print(f"--max-num-seqs 1 against the runs' baseline: {line_of(results['max_num_seqs_1'])}", flush=True)
        stored = json.loads(baseline.read_text())
        for level in stored["levels"].values():
            level["key"]["vllm_version"] = "0.24.0"
        other_version = work / "other-version.json"
        other_version.write_text(json.dumps(stored))
        started = time.monotonic()
        # refused on the key, whatever was measured: one round a level is enough to show it
        refused = run_gate(work, slower.url, spec, other_version, workload={**workload, "rounds": 1}, name="version")
        results["other_vllm_version"] = summary_of(refused, time.monotonic() - started)
        print(f"baseline of vLLM 0.24.0: rc={refused.returncode} "
              f"{[v['reason'] for v in results['other_vllm_version']['levels'].values()]}", flush=True)
    finally:
        slower.stop()


if __name__ == "__main__":
    raise SystemExit(main())
