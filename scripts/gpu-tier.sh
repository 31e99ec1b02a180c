#!/usr/bin/env bash
# gpu tier on the device machine (see docs/gpu-validation.md). Writes logs under $OUT.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >$OUT/install.log 2>&1 || { cat $OUT/install.log; exit 1; }
{ nvidia-smi; nvidia-smi --query-gpu=index,uuid,name,pci.bus_id,memory.used,memory.total,memory.reserved,power.draw,compute_cap,driver_version --format=csv,noheader,nounits; nvidia-smi topo -m; python3 -c "import pynvml; print(pynvml.__file__)"; python3 -m pip show nvidia-ml-py | head -2; } > $OUT/host-facts.txt 2>&1
GPUREADY_GPU_REPORT=$OUT/gpu-report.json python3 -m pytest tests/gpu -v -p no:cacheprovider -W default > $OUT/gpu-tier.log 2>&1; echo "gpu tier rc=$?"
python3 -m pytest --pyargs pytest_gpuready.preflight -p no:cacheprovider -rs -W default > $OUT/preflight-idle.log 2>&1; echo "preflight idle rc=$?"
python3 - <<'PY' > $OUT/probe-timing.txt 2>&1
import time, statistics
from pytest_gpuready.host.hosts import LocalHost
from pytest_gpuready.host.probe import snapshot
for reader in ("nvml", "nvidia-smi"):
    times = []
    for _ in range(10):
        t = time.perf_counter(); snapshot(LocalHost(), reader=reader); times.append(time.perf_counter() - t)
    print(reader, "median_s", round(statistics.median(times), 4), "min_s", round(min(times), 4))
PY
python3 -c "
import sys, torch
x = torch.empty(20 * 1024**3, dtype=torch.uint8, device='cuda:0'); torch.cuda.synchronize()
print('ready', flush=True); sys.stdin.read()" > $OUT/holder.txt 2>&1 < <(sleep 120) &
for i in $(seq 1 300); do grep -q ready $OUT/holder.txt 2>/dev/null && break; sleep 0.1; done
python3 -m pytest --pyargs pytest_gpuready.preflight -p no:cacheprovider -rs -W default > $OUT/preflight-held.log 2>&1; echo "preflight held rc=$?"
kill %1 2>/dev/null; wait
tail -5 $OUT/gpu-tier.log; cat $OUT/probe-timing.txt
