"""Will this checkpoint load with this TP/EP, KV dtype and GPU, and fit? Pure checks on a ModelSpec.

Each check reproduces a rule vLLM enforces only after minutes of weight loading, and answers in
milliseconds with a :class:`Verdict` whose failure reads like vLLM's own error plus the layer,
the sizes and what would work instead. The rules, their vLLM source locations and the versions
they changed in are in ``shared/reference/vllm-invariants.md``; every verdict names the rule
set it applied (``vLLM <= 0.28 rules``), and says so when the vLLM version was unknown.

One module per job:

- :mod:`.tensor_parallel`: TP divisibility (heads, vocab, KV heads, widths, in vLLM's order);
- :mod:`.fp8_blocks`: FP8 block alignment of every TP shard, and what would load instead;
- :mod:`.kv_cache`: the KV-cache dtype as vLLM resolves it, its bytes per token, the MLA backend;
- :mod:`.fit`: ``max_model_len`` against the config, and memory fit per GPU.

These are the implementations; what the markers, the suite, the planner and ``check_deployment``
call is :mod:`pytest_gpuready.model.rules`, each rule one of these on a
:class:`~pytest_gpuready.model.serve_args.ServeArgs`. No I/O here: the model comes from
:func:`pytest_gpuready.model.spec.inspect_model`, the GPUs from a
:class:`~pytest_gpuready.host.snapshot.HostSnapshot`.
"""

from pytest_gpuready.model.checks.common import GIB, KV_BLOCK_SIZE, MEMORY_RULES, MIB, TP_RULES, VOCAB_PADDING
from pytest_gpuready.model.checks.fit import (
    check_max_model_len,
    check_memory_fit,
    default_max_num_seqs,
    derived_max_model_len,
    memory_fit,
    memory_plan,
    memory_verdict,
)
from pytest_gpuready.model.checks.fp8_blocks import (
    FUSED_SHARDS,
    Partition,
    check_fp8_block_alignment,
    fp8_partitions,
    quantized_layers,
)
from pytest_gpuready.model.checks.kv_cache import (
    KvCacheDtype,
    check_mla_kv_backend,
    effective_kv_cache_dtype,
    kv_cache_bytes_per_token,
    kv_dtype_bytes,
)
from pytest_gpuready.model.checks.tensor_parallel import TP_GREATER_THAN_EXPERTS_MODEL_TYPES, check_tp_divisibility

__all__ = [
    "FUSED_SHARDS",
    "GIB",
    "KV_BLOCK_SIZE",
    "MEMORY_RULES",
    "MIB",
    "TP_GREATER_THAN_EXPERTS_MODEL_TYPES",
    "TP_RULES",
    "VOCAB_PADDING",
    "KvCacheDtype",
    "Partition",
    "check_fp8_block_alignment",
    "check_max_model_len",
    "check_memory_fit",
    "check_mla_kv_backend",
    "check_tp_divisibility",
    "default_max_num_seqs",
    "derived_max_model_len",
    "effective_kv_cache_dtype",
    "fp8_partitions",
    "kv_cache_bytes_per_token",
    "kv_dtype_bytes",
    "memory_fit",
    "memory_plan",
    "memory_verdict",
    "quantized_layers",
]
