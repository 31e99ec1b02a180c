#!/usr/bin/env bash
# The lifecycle proof on a real GPU with a real vLLM (issue 8, item 8). Run from the repo root on a
# machine with an NVIDIA GPU where `python3 -m vllm.entrypoints.openai.api_server` works, e.g. the
# device H200 after ../shared/device-vllm/README.md's three calls:
#
#   . /tmp/site/env.sh && OUT=$OUT bash scripts/gpu-lifecycle.sh
#
# Phases, each under its own time limit so the whole run ends within ~9 minutes and always prints
# its summary:
#   1. gpu tier (tests/gpu): NVML and nvidia-smi agree; the orphan story end to end (a random 1B
#      Llama launched by vllm_server; SIGKILL of the API server; gpus_clean names the orphaned
#      EngineCore; --gpu-reap-orphans stops it; the GPU reads clean; sem.loky-* removed);
#   2. SIGKILL of pytest while its server holds the GPU: time until the session is gone and the
#      GPU is clean (benchmarks/bench_watchdog.py --server vllm);
#   3. the vllm tier (tests/vllm) with the tiny model, --enforce-eager --gpu-memory-utilization 0.3.
# Everything lands in $OUT (default ./gpu-out), 7 files: summary.txt, host-facts.txt, gpu-tier.log,
# gpu-report.json, watchdog.log, watchdog.json, vllm-tier.log.
# GPUREADY_LIFECYCLE_PHASES=3 (or "1 2", ...) runs only those phases, e.g. the vllm tier alone in a
# second call if the first one's budget ran out before it finished. On the H200 every server start
# takes 45-95 s and the whole tier does not fit one 10-minute call: split it with
# GPUREADY_LIFECYCLE_VLLM_TESTS="tests/vllm/test_failures.py tests/vllm/test_lifecycle.py" and the
# rest in a further call.
set -u
OUT=${OUT:-./gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=${VLLM_USE_FLASHINFER_SAMPLER:-0}
mkdir -p ~/.cache/huggingface/hub
BEGAN=$(date +%s)
BUDGET=${GPUREADY_LIFECYCLE_BUDGET_S:-530}   # seconds for all three phases
left() { echo $(( BUDGET - ($(date +%s) - BEGAN) )); }
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
: > "$OUT/summary.txt"

python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/host-facts.txt" 2>&1 \
  || { cat "$OUT/host-facts.txt"; exit 1; }
{ date -u +%Y-%m-%dT%H:%M:%SZ; nvidia-smi; nvidia-smi --query-gpu=index,name,memory.used,memory.total,driver_version --format=csv,noheader
  python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"; } >> "$OUT/host-facts.txt" 2>&1
say "gpu-lifecycle $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(python3 -c 'import vllm; print("vLLM", vllm.__version__)' 2>/dev/null)"

MODEL=${GPUREADY_GPU_MODEL:-/tmp/gpuready-llama-1b}
[ -f "$MODEL/model.safetensors" ] || python3 tests/tiny_model.py --size 1b "$MODEL" >> "$OUT/host-facts.txt" 2>&1
export GPUREADY_GPU_MODEL=$MODEL GPUREADY_GPU_REPORT=$OUT/gpu-report.json
say "model: random 1B Llama in $MODEL ($(du -sh "$MODEL" | cut -f1)), after $(( $(date +%s) - BEGAN )) s"

PHASES=${GPUREADY_LIFECYCLE_PHASES:-1 2 3}
want() { case " $PHASES " in *" $1 "*) return 0;; esac; return 1; }

# 1. gpu tier, with the orphan story
if want 1; then
t=$(date +%s)
timeout $(( $(left) > 200 ? 200 : $(left) )) python3 -m pytest tests/gpu -m gpu -v -p no:cacheprovider -rA -W default \
  > "$OUT/gpu-tier.log" 2>&1; rc=$?
say "phase 1 gpu tier (incl. orphan story): rc=$rc in $(( $(date +%s) - t )) s: $(tail -1 "$OUT/gpu-tier.log")"
grep -E '^(FAILED|ERROR) |^E  ' "$OUT/gpu-tier.log" | head -12 | cut -c1-300 | sed 's/^/  /' | tee -a "$OUT/summary.txt"
python3 - "$OUT/gpu-report.json" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
try:
    data = json.load(open(sys.argv[1]))
except Exception as exc:
    print(f"  no gpu-report.json ({exc})"); raise SystemExit
story = data.get("orphan_story", {})
for key in ("startup_s", "orphan_seen_s", "gpus_clean_without_option", "reap_output", "reap_run_s", "after_reap", "shm_output"):
    if key in story:
        print(f"  orphan story {key}: {story[key]}")
fp = story.get("footprint") or {}
print(f"  orphan story footprint: {fp.get('gpu_memory_mib')} MiB, log {fp.get('log')}")
if "release_s" in data:
    print(f"  torch allocation released {data['release_s']:.2f} s after SIGKILL")
PY
fi

# 2. SIGKILL of pytest while its server holds the GPU
if want 2; then
t=$(date +%s)
timeout $(( $(left) > 150 ? 150 : $(left) )) python3 benchmarks/bench_watchdog.py --server vllm --where local \
  --state ready --repeat 1 --model "$MODEL" --max-model-len 4096 \
  --vllm-args "--enforce-eager --gpu-memory-utilization 0.5" --json "$OUT/watchdog.json" > "$OUT/watchdog.log" 2>&1; rc=$?
say "phase 2 SIGKILL of pytest with a ready 1B server on the GPU: rc=$rc in $(( $(date +%s) - t )) s"
grep -E '^\| vllm' "$OUT/watchdog.log" | sed 's/^/  /' | tee -a "$OUT/summary.txt"
[ "$rc" = 0 ] || tail -4 "$OUT/watchdog.log" | cut -c1-300 | sed 's/^/  /' | tee -a "$OUT/summary.txt"
fi

# 3. the vllm tier on the GPU
t=$(date +%s)
if ! want 3; then
  :
elif [ "$(left)" -gt 60 ]; then
  GPUREADY_VLLM_TIER_ARGS="--enforce-eager --gpu-memory-utilization 0.3" timeout "$(left)" \
    python3 -m pytest -m vllm ${GPUREADY_LIFECYCLE_VLLM_TESTS:-tests/vllm} -v -p no:cacheprovider -rA --durations=5 > "$OUT/vllm-tier.log" 2>&1; rc=$?
  say "phase 3 vllm tier: rc=$rc in $(( $(date +%s) - t )) s: $(grep -E '(passed|failed|error)' "$OUT/vllm-tier.log" | tail -1)"
  grep -E '^(FAILED|ERROR) ' "$OUT/vllm-tier.log" | sed 's/^/  /' | tee -a "$OUT/summary.txt"
else
  say "phase 3 vllm tier: not run, $(left) s of the budget left"
fi
say "GPU at the end: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader) used; compute apps: $(nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader | tr '\n' ';')"
say "total $(( $(date +%s) - BEGAN )) s"
