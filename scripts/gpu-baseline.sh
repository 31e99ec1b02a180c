#!/usr/bin/env bash
# Issue 21 on a real GPU with a real vLLM: the baseline gate's three behaviours and the false-alarm
# rate of its rule over 10 unchanged runs (benchmarks/bench_baseline_noise.py), with real captures of
# the GPU's clock-event reasons (idle in host-facts.txt; every level's samples in the JSON).
# Run from the repo root where `python3 -m vllm.entrypoints.openai.api_server` works, e.g. the
# device H200 after ../shared/device-vllm/README.md's three calls:
#
#   . /tmp/site/env.sh && OUT=$OUT bash scripts/gpu-baseline.sh
#
# BASELINE_RESTART=1: a fresh server for every unchanged run (each gate the first after a start,
# as in CI); BASELINE_RUNS=N (default 10). Everything lands in $OUT (default ./gpu-out): host-facts.txt, baseline-gpu.log, baseline-gpu.json.
set -u
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=${VLLM_USE_FLASHINFER_SAMPLER:-0}
mkdir -p ~/.cache/huggingface/hub
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/host-facts.txt" 2>&1 \
  || { cat "$OUT/host-facts.txt"; exit 1; }
{ date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=index,name,driver_version,clocks_event_reasons.active --format=csv
  nvidia-smi -q -d PERFORMANCE
  python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"; } >> "$OUT/host-facts.txt" 2>&1
MODEL=${GPUREADY_GPU_MODEL:-/tmp/gpuready-llama-1b}
[ -f "$MODEL/model.safetensors" ] || python3 tests/tiny_model.py --size 1b "$MODEL" >> "$OUT/host-facts.txt" 2>&1
timeout "${BASELINE_BUDGET_S:-500}" python3 benchmarks/bench_baseline_noise.py --runs "${BASELINE_RUNS:-10}" \
  --model "$MODEL" --max-model-len 2048 --vllm-args "--enforce-eager --gpu-memory-utilization 0.5" \
  --levels 1,16 --requests 8,32 --json "$OUT/baseline-gpu.json" ${BASELINE_RESTART:+--restart} 2>&1 \
  | tee "$OUT/baseline-gpu.log"
echo "bench rc=${PIPESTATUS[0]}"
