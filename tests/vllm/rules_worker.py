"""Build deployments with vLLM's own code on an emulated GPU; print what vLLM says about each.

    python -m tests.vllm.rules_worker SM CASES.json      (one capability per process)
    python -m tests.vllm.rules_worker real CASES.json    (a real GPU and a real GPU build of vLLM)

For every case (a model directory and a layout) it runs what ``vllm serve`` runs before the
weights: ``EngineArgs(...).create_engine_config()``, then the model's constructors on the meta
device with rank-0 parallel groups (``initialize_model`` under ``set_default_torch_dtype``, as
vLLM's model loader calls it). It prints one JSON line per case: ``{"id", "outcome": "loads" |
"raises", "error": type, "message"}``. Whatever vLLM raises is its verdict on the deployment.
See tests/vllm/emulated_gpu.py for what the emulation is (and is not).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def build(case: dict[str, Any]) -> dict[str, Any]:
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype
    from vllm.v1.worker.workspace import init_workspace_manager

    from tests.vllm.emulated_gpu import fake_parallel_state, meta_device

    started = time.perf_counter()
    try:
        args = EngineArgs(
            model=case["model_dir"], tensor_parallel_size=case["tp"], pipeline_parallel_size=case.get("pp", 1),
            data_parallel_size=case.get("dp", 1), enable_expert_parallel=case.get("ep", False),
            kv_cache_dtype=case.get("kv", "auto"), skip_tokenizer_init=True, load_format="dummy",
            enforce_eager=True, max_model_len=case.get("max_model_len", 2048),
        )
        config = args.create_engine_config()
        fake_parallel_state(config.parallel_config)
        init_workspace_manager(torch.device("meta"))  # the GPU worker does this before building the model
        with set_current_vllm_config(config), set_default_torch_dtype(config.model_config.dtype), meta_device():
            initialize_model(vllm_config=config, model_config=config.model_config)
    except Exception as exc:  # vLLM's verdict, whatever it raises
        return {"id": case["id"], "outcome": "raises", "error": type(exc).__name__,
                "message": str(exc).strip(), "seconds": round(time.perf_counter() - started, 3)}
    return {"id": case["id"], "outcome": "loads", "seconds": round(time.perf_counter() - started, 3)}


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m tests.vllm.rules_worker SM|real CASES.json", file=sys.stderr)
        return 2
    with open(argv[2]) as handle:
        cases = json.load(handle)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    if argv[1] == "real":
        # a real GPU build: only the GPU count is stood in (8, like the emulated runs), so TP=8
        # layouts are built on a 1-GPU machine; tensors still go to the meta device
        from vllm.platforms import current_platform
        type(current_platform).device_count = classmethod(lambda cls: 8)
    else:
        from tests.vllm.emulated_gpu import install
        major, minor = (int(part) for part in argv[1].split("."))
        install((major, minor))
    for case in cases:
        print(json.dumps(build(case)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
