#!/usr/bin/env bash
# Real vLLM startup logs for the memory model (docs/checks/memory_fit.md), on a GPU machine.
#
#   OUT=DIR bash scripts/device-memory-logs.sh [RUN ...]      (default: every run below)
#
# Each run starts `python3 -m vllm.entrypoints.openai.api_server` on a model directory that holds
# only config.json and a tokenizer, with --load-format dummy: vLLM allocates and fills the weights
# itself, so the GPU memory is exactly that of the real checkpoint without a download. The run
# ends when the server is ready (or has exited: the does-not-fit cases), the log and the GPU
# memory at ready are kept under $OUT, and the server's process group is stopped. Needs vLLM
# importable (see ../shared/device-vllm/) and `tokenizers`.
set -u
OUT=${OUT:-./memory-logs}
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)
export PYTHONUNBUFFERED=1

python3 - "$WORK" "$ROOT" <<'PY'
import json, sys
from pathlib import Path
work, root = Path(sys.argv[1]), Path(sys.argv[2])
sys.path.insert(0, str(root))
from tests.tiny_model import _train_tokenizer  # byte-level BPE, nothing downloaded
shapes = {
    # the public config as published (tests/data/configs/meta-llama__Llama-3.1-8B.json)
    "llama31-8b": json.loads((root / "tests/data/configs/meta-llama__Llama-3.1-8B.json").read_text()),
    # the 1B random Llama of measured-here.md (hidden 2048, 16 layers, 8 KV heads)
    "llama-1b": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000,
                 "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 16,
                 "num_attention_heads": 16, "num_key_value_heads": 8, "max_position_embeddings": 8192,
                 "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
                 "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
}
for name, config in shapes.items():
    d = work / name
    d.mkdir()
    _train_tokenizer(d)
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    (d / "config.json").write_text(json.dumps(config, indent=2))
print("models:", ", ".join(shapes))
PY

# name | model | args
RUNS=(
  "llama31-8b-u090-eager|llama31-8b|--gpu-memory-utilization 0.90 --max-model-len 8192 --enforce-eager"
  "llama31-8b-u050-eager-seqs512|llama31-8b|--gpu-memory-utilization 0.50 --max-model-len 8192 --enforce-eager --max-num-seqs 512 --max-num-batched-tokens 16384"
  "llama31-8b-u014-eager|llama31-8b|--gpu-memory-utilization 0.14 --max-model-len 8192 --enforce-eager"
  "llama31-8b-u011-eager|llama31-8b|--gpu-memory-utilization 0.11 --max-model-len 8192 --enforce-eager"
  "llama31-8b-u030-graphs|llama31-8b|--gpu-memory-utilization 0.30 --max-model-len 16384"
  "llama-1b-u090-eager-seqs1024|llama-1b|--gpu-memory-utilization 0.90 --max-model-len 4096 --enforce-eager --max-num-seqs 1024"
  "llama-1b-u020-eager-fp8kv|llama-1b|--gpu-memory-utilization 0.20 --max-model-len 4096 --enforce-eager --kv-cache-dtype fp8"
)
WANT=" $* "
port=8200
for run in "${RUNS[@]}"; do
  IFS='|' read -r name model args <<<"$run"
  if [ $# -gt 0 ] && [[ "$WANT" != *" $name "* ]]; then continue; fi
  port=$((port + 1))
  log="$OUT/vllm-0.25.0-h200-$name.log"
  echo "== $name: $args" | tee -a "$OUT/summary.txt"
  t0=$(date +%s)
  # shellcheck disable=SC2086
  setsid python3 -m vllm.entrypoints.openai.api_server --model "$WORK/$model" --served-model-name "$model" \
      --load-format dummy --port $port $args > "$log" 2>&1 < /dev/null &
  pid=$!
  state=timeout
  for _ in $(seq 1 600); do
    if grep -q "Application startup complete" "$log"; then state=ready; break; fi
    if ! kill -0 $pid 2>/dev/null; then state=exited; break; fi
    sleep 0.5
  done
  used=$(nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader,nounits | head -1)
  echo "   $state after $(( $(date +%s) - t0 )) s; GPU memory used,total MiB at that moment: $used" | tee -a "$OUT/summary.txt"
  grep -E "Model loading took|Available KV cache memory|GPU KV cache size|Maximum concurrency|non-default args|torch.compile took|Graph capturing finished|CUDA graph|ValueError|Error|memory" "$log" \
      | sed 's/^/   /' | cut -c1-400 | head -20 >> "$OUT/summary.txt"
  # Stop exactly the session setsid made (its id is the leader's pid): API server, EngineCore, workers.
  pkill -TERM -s $pid 2>/dev/null
  for _ in $(seq 1 60); do pgrep -s $pid >/dev/null || break; sleep 0.5; done
  pkill -KILL -s $pid 2>/dev/null
  for _ in $(seq 1 60); do
    [ "$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)" -lt 1024 ] && break; sleep 0.5
  done
done
nvidia-smi --query-gpu=name,memory.total,compute_cap,driver_version --format=csv > "$OUT/gpu.txt"
rm -rf "$WORK"
cat "$OUT/summary.txt"
