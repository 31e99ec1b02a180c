"""Memory fit and max_model_len: vLLM's startup accounting per GPU (:mod:`~pytest_gpuready.model.memory`)
as a Verdict."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from pytest_gpuready.errors import ConfigError
from pytest_gpuready.host.snapshot import GpuInfo, HostSnapshot
from pytest_gpuready.model import memory
from pytest_gpuready.model.checks.common import (
    GIB,
    KV_BLOCK_SIZE,
    MEMORY_RULES,
    MIB,
    _version,
)
from pytest_gpuready.model.checks.kv_cache import KvCacheDtype, effective_kv_cache_dtype, kv_dtype_bytes
from pytest_gpuready.model.serve_args import ServeArgs
from pytest_gpuready.model.spec import ModelSpec, derived_weights_for
from pytest_gpuready.model.vllm_version import (
    VllmVersion,
)
from pytest_gpuready.verdict import Verdict


def default_max_num_seqs(gpu: GpuInfo) -> int:
    """vLLM's default ``--max-num-seqs`` for this GPU (see :func:`memory.default_max_num_seqs`)."""
    return memory.default_max_num_seqs(gpu.memory_total_mib * MIB, gpu.name)


def _gib(n_bytes: float) -> str:
    return f"{n_bytes / GIB:.2f}"


def _holders(snapshot: HostSnapshot, index: int) -> str:
    procs = snapshot.processes_on(index)
    if not procs:
        return ""
    held = ", ".join(f"pid {p.pid} ({p.name}) {p.used_memory_mib} MiB" if p.used_memory_mib is not None
                     else f"pid {p.pid} ({p.name})" for p in procs)
    return f"; held by {held}"


def derived_max_model_len(model: ModelSpec) -> tuple[int | None, str]:
    """The longest ``max_model_len`` vLLM accepts without ``VLLM_ALLOW_LONG_MAX_MODEL_LEN``, and
    the key it came from (``_get_and_verify_max_len``, ``vllm/config/model.py``, 0.19-0.32):
    ``max_position_embeddings``, times the RoPE scaling factor except for llama3/longrope/su."""
    config = model.config.get("text_config") or model.config
    base = model.max_position_embeddings
    if base is None:
        return None, "max_position_embeddings"
    scaling = config.get("rope_scaling") or config.get("rope_parameters")
    if isinstance(scaling, dict):
        kind = scaling.get("rope_type") or scaling.get("type")
        factor = scaling.get("factor")
        if kind not in (None, "default", "su", "longrope", "llama3") and isinstance(factor, (int, float)) \
                and "original_max_position_embeddings" not in scaling:
            return int(base * factor), f"max_position_embeddings x rope_scaling.factor {factor:g}"
    return base, "max_position_embeddings"


def check_max_model_len(model: ModelSpec, max_model_len: int | None, *,
                        allow_long: bool = False) -> Verdict:
    """A ``max_model_len`` above the config's limit fails as vLLM's startup does, unless
    ``VLLM_ALLOW_LONG_MAX_MODEL_LEN`` is set (then a warning)."""
    limit, key = derived_max_model_len(model)
    evidence = {"max_model_len": max_model_len, "derived_max_model_len": limit}
    if max_model_len is None or limit is None or max_model_len <= limit:
        shown = max_model_len if max_model_len is not None else limit
        return Verdict.passed(f"{model.name}: max_model_len {shown} is within the config's {key} ({limit})",
                              evidence=evidence, rule_set=MEMORY_RULES)
    message = (f"User-specified max_model_len ({max_model_len}) is greater than the derived max_model_len "
               f"({key}={limit} or model_max_length=None in model's config.json).")
    if allow_long:
        return Verdict.passed(f"{model.name}: {message} Allowed by VLLM_ALLOW_LONG_MAX_MODEL_LEN=1",
                              evidence=evidence, rule_set=MEMORY_RULES,
                              warnings=(f"{model.name}: max_model_len {max_model_len} > {limit}: positions "
                                        "past the trained length lead to nan with RoPE",))
    return Verdict.failed(f"{model.name}: {message} To allow overriding this maximum, set the env var "
                          "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.", evidence=evidence, rule_set=MEMORY_RULES)


def check_memory_fit(
    model: ModelSpec,
    snapshot: HostSnapshot,
    tp: int,
    gpus: Sequence[int] | None = None,
    gpu_memory_utilization: float = 0.9,
    max_model_len: int | None = None,
    max_num_seqs: int | None = None,
    kv_cache_dtype: str = "auto",
    *,
    vllm_version: VllmVersion | str | None = None,
    reserve_gib: float | None = None,
    pipeline_parallel_size: int = 1,
    data_parallel_size: int = 1,
    ep: bool = False,
    dtype: str = "auto",
    quantization: str | None = None,
    enforce_eager: bool = False,
    max_num_batched_tokens: int | None = None,
    allow_long_max_model_len: bool = False,
    speculative: memory.SpeculativeSettings | None = None,
) -> Verdict:
    """:func:`memory_fit` with the serve arguments as keywords (the ``memory_fit`` marker's
    signature): they become one :class:`ServeArgs`, which is all the memory model reads."""
    args = ServeArgs(tp=tp, pp=pipeline_parallel_size, dp=data_parallel_size, ep=ep, kv_cache_dtype=kv_cache_dtype,
                     dtype=dtype, quantization=quantization, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                     max_num_batched_tokens=max_num_batched_tokens, gpu_memory_utilization=gpu_memory_utilization,
                     enforce_eager=enforce_eager)
    return memory_fit(model, snapshot, args, gpus=gpus, vllm_version=vllm_version, reserve_gib=reserve_gib,
                      allow_long_max_model_len=allow_long_max_model_len, speculative=speculative)


def memory_fit(model: ModelSpec, snapshot: HostSnapshot, args: ServeArgs, *, gpus: Sequence[int] | None = None,
               vllm_version: VllmVersion | str | None = None, reserve_gib: float | None = None,
               allow_long_max_model_len: bool = False,
               speculative: memory.SpeculativeSettings | None = None) -> Verdict:
    """Will the weights, vLLM's profile-run reserve and one full-length request's KV cache fit?

    The accounting is vLLM's own, per version (:mod:`pytest_gpuready.model.memory`): budget
    ``ceil(total x utilization)``, minus weights, the profile run's activation peak
    (max_num_batched_tokens forward, max_num_seqs sampler), non-torch memory (NCCL at TP/PP > 1)
    and, where that version counts it, CUDA-graph memory. Each term is in the details in GiB,
    saying whether it was read, derived or measured. Fails like vLLM's startup: ``Free memory on
    device ...`` when a GPU lacks the budget, ``No available memory for the cache blocks``, ``To serve
    at least one request ...``, or a max_model_len above the config's. ``reserve_gib`` replaces the
    model's non-weight terms by one fixed figure (the 0.1 behaviour). Sources: vllm-invariants.md §3.
    ``data_parallel_size`` engines of TP x PP GPUs each take ``gpus`` in order; every GPU is judged
    (a MoE model's experts are split over TP x DP ranks). What vLLM allocates after the KV cache
    (the sampler warm-up, CUDA graphs where not counted) must fit outside the budget, else it fails
    as vLLM does: ``CUDA out of memory occurred when warming up sampler with N dummy requests``. A
    vLLM version the accounting does not cover is *undecided*, naming the range it covers.
    ``speculative`` adds a draft's memory (:class:`memory.SpeculativeSettings`); without it, the
    serve arguments' ``--speculative-config`` is read (:func:`memory.speculative_settings`), and
    what the config cannot size (a separate draft model's weights) is a warning of the verdict.
    """
    weights = model.weights
    if weights is not None and not weights.sized:
        # The readable shards alone would understate the weights: a fit on them is no answer.
        raise ConfigError(f"{model.name}: cannot size the weights, {weights.unreadable_shards} of "
                          f"{weights.shard_count} shard(s) unreadable"
                          + (f" ({weights.problems[0]})" if weights.problems else ""))
    version = _version(vllm_version)
    present = snapshot.require_gpus()
    host = snapshot.host
    tp, dp, pp = args.tp, args.dp, args.pp
    gpu_memory_utilization = args.gpu_memory_utilization
    world = args.total_gpus
    if gpus is None:
        selected = sorted(present, key=lambda g: g.index)[:world]
    else:
        selected = [snapshot.gpu(i) for i in gpus][:world]
    evidence: dict[str, Any] = {"host": host, "tp": tp, "pp": pp, "dp": dp,
                                "gpus": [g.index for g in selected],
                                "gpu_memory_utilization": gpu_memory_utilization}
    layout = ((f"DP={dp} " if dp > 1 else "") + f"TP={tp}"
              + (f" PP={pp}" if pp > 1 else ""))
    if len(selected) < world:
        have = ", ".join(str(g.index) for g in (present if gpus is None else selected)) or "none"
        return Verdict.failed(f"{layout} needs {world} GPUs; {host} offers {len(selected)} (GPUs {have})",
                              evidence=evidence, rule_set=MEMORY_RULES)
    length_verdict = check_max_model_len(model, args.max_model_len, allow_long=allow_long_max_model_len)
    if not length_verdict.ok:
        return length_verdict
    unmodelled = memory.unmodelled_reason(version)
    if unmodelled is not None:
        return Verdict.undecided(
            f"{model.name} at {layout}: memory fit undecided: {unmodelled}", evidence=evidence,
            needs=(f"a vLLM version from {memory.MODELLED_SINCE[0]}.{memory.MODELLED_SINCE[1]} to "
                   f"{memory.NEWEST_READ[0]}.{memory.NEWEST_READ[1]} (--vllm-version), the range the "
                   "memory accounting models"), rule_set=f"no memory rule set covers vLLM {version}")
    kv = effective_kv_cache_dtype(model, args.kv_cache_dtype, version)
    unsized = memory.kv_unsized_reason(model, kv.name)
    if unsized is not None:
        evidence["kv_cache_dtype"] = kv.name
        return Verdict.undecided(
            f"{model.name} at {layout}: memory fit undecided: {unsized}", evidence=evidence,
            needs=("a --kv-cache-dtype whose KV page the memory model sizes (auto, bfloat16, float16, fp8*, "
                   "nvfp4 on GQA attention, fp8_ds_mla or nvfp4_ds_mla on MLA)"), rule_set=MEMORY_RULES)
    errors: list[str] = []
    warnings: list[str] = list(length_verdict.warnings)
    per_gpu: list[dict[str, Any]] = []
    smallest: GpuInfo = selected[0]
    for position, gpu in enumerate(selected):
        total = (gpu.memory_total_mib - (gpu.memory_reserved_mib or 0)) * MIB
        free = gpu.memory_free_mib * MIB
        requested = math.ceil(total * gpu_memory_utilization)
        per_gpu.append({"index": gpu.index, "total_bytes": total, "free_bytes": free,
                        "requested_bytes": requested})
        if total < (smallest.memory_total_mib - (smallest.memory_reserved_mib or 0)) * MIB:
            smallest = gpu
        if free < requested:
            errors.append(
                f"GPU {gpu.index}: Free memory on device cuda:{position} ({_gib(free)}/{_gib(total)} GiB) "
                f"on startup is less than desired GPU memory utilization ({gpu_memory_utilization}, "
                f"{_gib(requested)} GiB). Decrease GPU memory utilization or reduce GPU memory used "
                f"by other processes.{_holders(snapshot, gpu.index)}")
        elif free - requested < GIB:
            warnings.append(f"GPU {gpu.index}: only {(free - requested) // MIB} MiB free above the "
                            f"{gpu_memory_utilization} budget; a process starting now would break it")
    evidence["per_gpu"] = per_gpu
    if errors:
        return Verdict.failed(f"{model.name} at {layout}: {errors[0]}", details=tuple(errors[1:]),
                              evidence=evidence, rule_set=MEMORY_RULES)
    total_bytes = (smallest.memory_total_mib - (smallest.memory_reserved_mib or 0)) * MIB
    plan = memory_plan(model, total_bytes, args, version=version, gpu_name=smallest.name,
                       reserve_gib=reserve_gib, speculative=speculative)
    return memory_verdict(model, plan, layout, kv, evidence, warnings)


def memory_plan(model: ModelSpec, total_bytes: int, args: ServeArgs, *, version: VllmVersion | None = None,
                gpu_name: str = "", reserve_gib: float | None = None,
                speculative: memory.SpeculativeSettings | None = None) -> memory.MemoryPlan:
    """:func:`memory.plan_memory` for ``args`` with the KV dtype resolved as vLLM resolves it;
    ``reserve_gib`` replaces the non-weight terms by one fixed figure."""
    kv = effective_kv_cache_dtype(model, args.kv_cache_dtype, version)
    said: tuple[str, ...] = ()
    unknowns: tuple[str, ...] = ()
    if speculative is None and args.speculative_config is not None:
        speculative, line, unknowns = memory.speculative_settings(model, args.speculative_config, args.tp)
        said = (line,)
    plan = memory.plan_memory(model, total_bytes, replace(args, kv_cache_dtype=kv.name),
                              kv_dtype_bytes=kv_dtype_bytes(model, kv.name, args.dtype) if kv.name != "fp8_ds_mla"
                              else 1, fp8_ds_mla=kv.name == "fp8_ds_mla", version=version, gpu_name=gpu_name,
                              speculative=speculative)
    if said or unknowns:
        plan = replace(plan, notes=(*plan.notes, *said, *unknowns), unknowns=unknowns)
    if reserve_gib is None:
        return plan
    weights = plan.terms[0]
    reserve = memory.MemoryTerm("reserve", int(reserve_gib * GIB), "given", "reserve_gib replaces vLLM's "
                                "profile-run terms")
    kv_bytes = plan.budget_bytes - weights.bytes - reserve.bytes
    blocks = max(0, kv_bytes) // (plan.kv_bytes_per_token * KV_BLOCK_SIZE)
    return replace(plan, terms=(weights, reserve), kv_cache_bytes=max(0, kv_bytes),
                   kv_tokens=blocks * KV_BLOCK_SIZE, outside_budget=())


def _after_kv_failure(plan: memory.MemoryPlan) -> str | None:
    """vLLM's error when what it allocates after the KV cache (CUDA graphs where not counted, then
    the sampler warm-up) does not fit outside the budget; None when it fits."""
    headroom = plan.total_bytes - plan.budget_bytes
    graphs = sum(t.bytes for t in plan.outside_budget if t.name == "CUDA graphs")
    after = sum(t.bytes for t in plan.outside_budget)
    if after <= headroom:
        return None
    outside = ", ".join(f"{t.name} {_gib(t.bytes)} GiB" for t in plan.outside_budget)
    where = (f"after the KV cache vLLM allocates {outside} = {_gib(after)} GiB, more than the "
             f"{_gib(headroom)} GiB the gpu_memory_utilization budget leaves outside it")
    if graphs > headroom:
        return (f"CUDA out of memory while capturing CUDA graphs (gpu_model_runner.py:capture_model): {where}. "
                "Lower `gpu_memory_utilization` or pass --enforce-eager.")
    requests = min(plan.max_num_seqs, plan.max_num_batched_tokens)
    return (f"CUDA out of memory occurred when warming up sampler with {requests} dummy requests. "
            "Please try lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the "
            f"engine. ({where})")


def memory_verdict(model: ModelSpec, plan: memory.MemoryPlan, layout: str, kv: KvCacheDtype,
                   evidence: dict[str, Any], warnings: list[str]) -> Verdict:
    """Turn a :class:`memory.MemoryPlan` into the fit verdict, in vLLM's words when it does not fit."""
    length = plan.max_model_len
    tokens = plan.kv_tokens
    available = plan.kv_cache_bytes
    evidence.update({"weights_per_gpu_bytes": plan.terms[0].bytes, "budget_bytes": plan.budget_bytes,
                     "non_kv_bytes": plan.non_kv_bytes, "kv_cache_bytes": available,
                     "kv_cache_dtype": kv.name, "kv_bytes_per_token": plan.kv_bytes_per_token,
                     "kv_cache_tokens": tokens, "max_model_len": length, "max_num_seqs": plan.max_num_seqs,
                     "max_num_batched_tokens": plan.max_num_batched_tokens,
                     "terms": {t.name: {"bytes": t.bytes, "how": t.how} for t in plan.terms},
                     "weights_read_from": model.weights.read_from if model.weights else "derived from config.json"})
    details = [*plan.lines(), f"KV-cache dtype: {kv.reason}"]
    warnings.extend(plan.unknowns)
    weights = model.weights or derived_weights_for(model)
    if not weights.from_headers:
        warnings.append(f"{model.name}: weights {weights.provenance()}")
    if available <= 0:
        return Verdict.failed(
            f"{model.name} at {layout}: No available memory for the cache blocks. Try increasing "
            "`gpu_memory_utilization` when initializing the engine "
            f"({_gib(plan.non_kv_bytes)} GiB of weights and profile-run memory per GPU exceed the "
            f"{_gib(plan.budget_bytes)} GiB budget; or use more GPUs).",
            details=tuple(details), evidence=evidence, warnings=tuple(warnings), rule_set=plan.rule_set)
    if length is None:
        return Verdict.failed(
            f"{model.name}: max_model_len is not given and the config has no "
            "max_position_embeddings; pass max_model_len", details=tuple(details), evidence=evidence,
            rule_set=plan.rule_set)
    concurrency = plan.max_concurrency or 0.0
    evidence["max_concurrency"] = concurrency
    details += [f"Maximum concurrency for {length:,} tokens per request: {concurrency:.2f}x",
                f"at max_num_seqs={plan.max_num_seqs} running together: {tokens // plan.max_num_seqs:,} tokens each"]
    if tokens < length:
        needed = length * plan.kv_bytes_per_token
        return Verdict.failed(
            f"{model.name} at {layout}: To serve at least one request with the models's max seq len "
            f"({length}), ({_gib(needed)} GiB KV cache is needed, which is larger than the available "
            f"KV cache memory ({_gib(available)} GiB). Based on the available memory, the estimated "
            f"maximum model length is {tokens}. Try increasing `gpu_memory_utilization` or "
            "decreasing `max_model_len` when initializing the engine.",
            details=tuple(details), evidence=evidence, warnings=tuple(warnings), rule_set=plan.rule_set)
    after_kv = _after_kv_failure(plan)
    if after_kv is not None:
        evidence["after_kv_cache_bytes"] = sum(t.bytes for t in plan.outside_budget)
        return Verdict.failed(f"{model.name} at {layout}: {after_kv}", details=tuple(details), evidence=evidence,
                              warnings=tuple(warnings), rule_set=plan.rule_set)
    if concurrency < 2:
        warnings.append(f"thin headroom: the KV cache holds {concurrency:.2f} requests of {length:,} tokens")
    return Verdict.passed(
        f"{model.name} fits at {layout}: {tokens:,} KV tokens, {concurrency:.2f} requests of "
        f"{length:,} tokens", details=tuple(details), evidence=evidence, warnings=tuple(warnings),
        rule_set=plan.rule_set)
