#!/usr/bin/env bash
# GPU health on the device machine (docs/gpu-validation.md, "GPU health"). Writes logs under $OUT.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >$OUT/install.log 2>&1 || { cat $OUT/install.log; exit 1; }
{ nvidia-smi topo -p2p r; echo "rc=$?"; nvidia-smi topo -p2p w; echo "rc=$?"; id -u; dmesg 2>&1 | grep -c 'NVRM: Xid'; \
  python3 -c "import pynvml; print(pynvml.__file__)"; python3 -m pip list 2>/dev/null | grep -iE '^(torch|nvidia-cuda-runtime|nvidia-ml-py) '; } > $OUT/health-facts.txt 2>&1
python3 -m pytest --pyargs pytest_gpuready.preflight.test_host pytest_gpuready.preflight.test_health -p no:cacheprovider -rA -W default > $OUT/preflight-health.log 2>&1; echo "preflight health rc=$?"
python3 - <<'PY' > $OUT/health-timing.txt 2>&1
import statistics, time
from pytest_gpuready.host.hosts import LocalHost
from pytest_gpuready.host.probe import snapshot
for _ in range(3):
    snapshot(LocalHost())  # warm the page cache and the driver
for reader in ("nvml", "nvidia-smi"):
    for health in (False, True):
        times = []
        for _ in range(15):
            t = time.perf_counter(); snap = snapshot(LocalHost(), reader=reader, health=health); times.append(time.perf_counter() - t)
        print(reader, "health" if health else "no-health", "median_s", round(statistics.median(times), 4), "min_s", round(min(times), 4), "errors", snap.errors)
snap = snapshot(LocalHost(), reader="nvml")
print(snap.health)
PY
python3 - <<'PY' > $OUT/clock-sampler.txt 2>&1
import json, threading, time, torch
from pytest_gpuready.host.hosts import LocalHost
from pytest_gpuready.host.clock_events import ClockEventSampler
host = LocalHost()
with ClockEventSampler(host, interval_s=0.2) as idle:
    time.sleep(1.0)
print("idle", json.dumps(idle.record.to_dict()))
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
with ClockEventSampler(host, interval_s=0.2) as load:
    end = time.time() + 6
    while time.time() < end:
        for _ in range(20): a @ b
        torch.cuda.synchronize()
print("matmul", json.dumps(load.record.to_dict()))
print("describe", load.record.describe())
PY
cat $OUT/health-timing.txt | head -5; tail -3 $OUT/preflight-health.log; cat $OUT/clock-sampler.txt | tail -3
