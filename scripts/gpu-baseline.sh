#!/usr/bin/env bash
# Issue 21 on a real GPU with a real vLLM: the false-alarm rate of the baseline rule over unchanged
# gate runs, each with a fresh server as CI has it (benchmarks/bench_baseline_noise.py --restart),
# then a --max-num-seqs 1 server against the baseline those runs built, and a baseline of another
# vLLM version refused. Real captures of the GPU's clock-event reasons go with every level.
# Run from the repo root where `python3 -m vllm.entrypoints.openai.api_server` works, e.g. the
# device H200 after ../shared/device-vllm/README.md's three calls. The runs can be spread over
# several calls of one machine (the work folder keeps the baseline and every run):
#
#   . /tmp/site/env.sh && OUT=$OUT BASELINE_RUNS=6 BASELINE_BUDGET_S=480 bash scripts/gpu-baseline.sh
#   . /tmp/site/env.sh && OUT=$OUT BASELINE_RUNS=6 BASELINE_FINISH=1 bash scripts/gpu-baseline.sh
#
# BASELINE_WORK (default /tmp/gpuready-baseline): kept between calls. BASELINE_LONG_LIVED=1: one
# server for every run instead of a fresh one each. Everything lands in $OUT (default ./gpu-out):
# host-facts.txt, baseline-gpu.log (appended), results.json, baseline.json, replay.json.
set -u
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
WORK=${BASELINE_WORK:-/tmp/gpuready-baseline}; mkdir -p "$WORK"
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
[ -f "$WORK/baseline-gpu.log" ] && cp "$WORK/baseline-gpu.log" "$OUT/baseline-gpu.log"
timeout "$(( ${BASELINE_BUDGET_S:-540} + 60 ))" python3 benchmarks/bench_baseline_noise.py --work "$WORK" \
  --runs "${BASELINE_RUNS:-12}" --budget-s "${BASELINE_BUDGET_S:-540}" ${BASELINE_FINISH:+--finish} \
  $( [ -n "${BASELINE_LONG_LIVED:-}" ] || echo --restart ) --model "$MODEL" --max-model-len 2048 \
  --vllm-args "--enforce-eager --gpu-memory-utilization 0.5" --levels 1,16 --requests 8,32 2>&1 \
  | tee -a "$OUT/baseline-gpu.log"
echo "bench rc=${PIPESTATUS[0]}" | tee -a "$OUT/baseline-gpu.log"
cp "$OUT/baseline-gpu.log" "$WORK/baseline-gpu.log"
cp "$WORK/results.json" "$WORK/baseline.json" "$OUT/" 2>/dev/null
python3 benchmarks/bench_baseline_noise.py --replay "$WORK/results.json" > "$OUT/replay.json" 2>&1
tail -5 "$OUT/replay.json"
