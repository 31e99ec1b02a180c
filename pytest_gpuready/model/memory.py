"""vLLM's per-GPU memory accounting, term by term, per vLLM version: how much KV cache a layout gets.

vLLM sizes the KV cache at startup (``Worker.determine_available_memory``,
``vllm/v1/worker/gpu_worker.py``, the same structure 0.11-0.32)::

    requested   = ceil(total x gpu_memory_utilization)                      (worker/utils.py:request_memory)
    non_kv      = weights + torch peak increase of the profile run + non-torch increase
    kv_cache    = requested - non_kv - cudagraph estimate (only where applied, see below)

The profile run (``GPUModelRunner.profile_run``) is one dummy forward pass over
``max_num_batched_tokens`` tokens split into ``min(max_num_seqs, tokens)`` requests, then a
sampler run over the last token of each (``_dummy_sampler_run``: the same ``max_num_seqs`` dummy
requests the warm-up samples, whose OOM reads "CUDA out of memory occurred when warming up
sampler with 1024 dummy requests"). Its torch peak is the larger of the forward pass's live
activations and the sampler's logits. Non-torch memory is what the process holds outside torch's
allocator: lazily loaded kernels, NCCL communicators and the custom all-reduce buffers at TP/PP > 1.

CUDA graphs: captured after the KV cache is allocated (``capture_model``), so before 0.2x their
memory came out of the ``1 - gpu_memory_utilization`` headroom. ``profile_cudagraph_memory``
estimates it during profiling and ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` decides whether the
estimate is taken off the KV cache: off by default in 0.19 (``envs.py``), on by default in 0.25
and 0.32; the V2 model runner returns 0 in 0.25 (``gpu/model_runner.py:profile_cudagraph_memory``)
and estimates in 0.32. 0.25 uses the V2 runner for dense decoder-only models
(``VllmConfig._is_default_v2_model_runner_model``: not MoE, not hybrid), 0.32 for all by default.

After the KV cache is allocated, ``Worker.compile_or_warm_up_model`` captures the CUDA graphs and
then warms the sampler up with ``min(max_num_seqs, max_num_batched_tokens)`` dummy requests over
the whole vocabulary ("to preallocate memory buffer for logits and other sampling related tensors
of max possible shape", vLLM's comment there; after ``capture_model`` on purpose, so that
``empty_cache`` cannot release them). Both come out of what ``gpu_memory_utilization`` leaves
outside the budget: the profile run's share of the budget has become KV cache by then. gpt-oss-20b
on one H100 at 0.95 (vLLM 0.19) logs ``Available KV cache memory: 58.47 GiB`` and then ``CUDA out of
memory occurred when warming up sampler with 1024 dummy requests``; :func:`warm_up_terms`.

Versions: the accounting above is the V1 engine's, read in 0.19, 0.25 and 0.32 and unchanged in
structure from 0.11 (:data:`MODELLED_SINCE`). Before that the V0 engine (the default before 0.8,
selectable until 0.10) profiled differently (``worker/worker.py:determine_num_available_blocks``),
and its figures are not these: :func:`unmodelled_reason` names the range, and the fit check is
*undecided* there rather than a number from another engine.

Every term is computed here from the model's config and the serve settings; the constants that
stand for what only a GPU can measure (non-torch memory, CUDA-graph pools) are figures measured on
real startups, each named with where it was measured. :class:`MemoryPlan` carries each term in
bytes with how it was obtained, so a verdict can print them in GiB and a miss can be read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pytest_gpuready.model.derived_weights import derive_weights
from pytest_gpuready.model.serve_args import ServeArgs, SpeculativeConfig
from pytest_gpuready.model.spec import DERIVED, ModelSpec, Weights, derived_weights_for
from pytest_gpuready.model.vllm_version import VllmVersion

GIB = 1024**3
MIB = 1024**2

KV_BLOCK_SIZE = 16
FUSED_MOE_CHUNK = 32768
"""``VLLM_FUSED_MOE_CHUNK_SIZE``: the fused-MoE kernels process at most this many tokens at once."""
SAMPLER_BYTES_PER_LOGIT = 18
"""Live bytes per (request, vocab entry) at the sampler's peak with the Triton top-k/top-p kernel
(0.19-0.32, ``apply_top_k_top_p_triton`` for >= 8 requests): the lm_head's bf16 logits (2), their
float32 copy (4), the softmax probabilities (4), the exponential noise ``q`` (4) and ``probs.div(q)`` (4)
(``topk_topp_sampler.py:forward_native`` / ``random_sample``): the V1 model runner's sampler."""
SAMPLER_BYTES_PER_LOGIT_V2 = 6
"""The V2 model runner's sampler (0.25+, ``v1/worker/gpu/sample``): the bf16 logits and one float32
copy. An upper bound from the H200 logs of vLLM 0.25.0: with Llama-3.1-8B (vocab 128,256, 1,024
dummy requests) the whole reserve is 1.14 GiB, of which the forward pass alone is 0.84 GiB."""
BASE_NON_TORCH_BYTES = int(0.28 * GIB)
"""Non-torch memory a TP=1 worker adds between its start snapshot and the end of profiling (lazily
loaded kernel modules, cuBLAS handles): measured 0.27-0.30 GiB on the H200 with vLLM 0.25.0
(``shared/data/vllm-logs``: 0.73 GiB kept back eager, 0.79 compiled, less the activation terms here)."""
COMMUNICATOR_BYTES = int(1.6 * GIB)
"""Non-torch memory of the NCCL communicators and custom all-reduce buffers per GPU at TP or PP > 1:
the issue's H100 measurements with vLLM 0.19 kept back 3.3-4.4 GiB per GPU at TP >= 2, about 2 GiB
of it non-torch; 1.6 GiB is what remains of Qwen2.5-72B's 4.4 GiB at TP=2 after its sampler term."""
MODELLED_SINCE = (0, 11)
"""The oldest vLLM release whose memory accounting this module models (the V1 engine's
``determine_available_memory`` with ``memory_profiling``, read in 0.19.0, 0.25.0, 0.32.0; 0.11 is the
first release without the V0 engine)."""
NEWEST_READ = (0, 33)
"""The newest release read (vllm-invariants.md §0); later releases get its rules, saying so."""
CUDAGRAPH_BYTES_PER_LAYER = int(0.44 * GIB / 16)
"""CUDA-graph pool per decoder layer with the default capture sizes (51 sizes up to 512, FULL and
PIECEWISE): measured 0.44 GiB for a 16-layer Llama on the H200 with vLLM 0.25.0
(``Graph capturing finished in 3 secs, took 0.44 GiB``)."""


@dataclass(frozen=True)
class SpeculativeSettings:
    """What speculative decoding adds to one GPU's memory, as vLLM's code allocates it.

    * ``draft_weight_bytes``: the draft model's weights on this GPU (an EAGLE head, a separate draft
      model; 0 for MTP layers the checkpoint already holds, which ``num_nextn_predict_layers``
      counts as unused until they are loaded: pass their bytes here when they are);
    * ``draft_layers``: decoder layers of the draft that keep a KV cache (EAGLE: 1, MTP: the
      ``num_nextn_predict_layers``, a draft model: its layers), with the target's KV head layout;
    * ``num_speculative_tokens``: the proposer's tokens per step. The sampler warm-up then runs the
      rejection sampler over one draft token per dummy request (``_dummy_sampler_run``:
      ``target_logits = torch.randn(num_tokens, vocab)``, ``gpu_model_runner.py`` 0.9-0.32), a second
      ``requests x vocab`` logits tensor in the model dtype.
    """

    num_speculative_tokens: int = 0
    draft_layers: int = 0
    draft_weight_bytes: int = 0


DRAFT_HEAD_METHODS = {"eagle": 1, "eagle3": 1, "medusa": 0, "mlp_speculator": 0}
"""Draft heads by ``--speculative-config`` method, and how many decoder layers with a KV cache each
adds (an EAGLE head is one decoder layer; Medusa and MLP speculator heads attend nothing). Their
weights live in a separate checkpoint (``model``), which the target's config does not size."""
NO_DRAFT_METHODS = frozenset({"ngram", "suffix"})
"""Proposers without a model: no weights, no KV pages; the rejection sampler still runs."""


def speculative_settings(model: ModelSpec, config: SpeculativeConfig,
                         tp: int) -> tuple[SpeculativeSettings, str, tuple[str, ...]]:
    """What ``--speculative-config`` adds to one GPU of ``model`` at TP=tp, a line saying so, and what
    the config alone cannot tell (the draft model's weights, its layers), for the verdict to say.

    ``method`` as vLLM resolves it (``SpeculativeConfig.__post_init__``): an ``*_mtp`` method (or
    none, on a model with MTP layers) drafts with the checkpoint's own next-n layers, whose weights
    the spec counts as unused until then (loaded now, split over TP) and which keep KV pages;
    ``ngram`` / ``suffix`` need no model; EAGLE / Medusa heads and a separate draft model live in
    another checkpoint (``model``), which the target's config does not size."""
    method = (config.method or "").lower()
    if not method:
        method = "mtp" if config.model is None and model.num_nextn_predict_layers else (
            "eagle" if config.model and "eagle" in config.model.lower() else "draft_model")
    mtp_layers = model.num_nextn_predict_layers
    tokens = config.num_speculative_tokens or (mtp_layers if method.endswith("mtp") else 0)
    unknown: list[str] = []
    draft = f"the draft {config.model!r}" if config.model else "the draft model (none named)"
    if method in NO_DRAFT_METHODS:
        settings = SpeculativeSettings(tokens, 0, 0)
        how = f"{method}: no draft model, no draft KV pages"
    elif method.endswith("mtp"):
        weights = model.weights or derived_weights_for(model)
        mtp_bytes = weights.unused_bytes // max(1, tp)
        settings = SpeculativeSettings(tokens, mtp_layers, mtp_bytes)
        how = (f"{method}: the checkpoint's {mtp_layers} MTP layer(s) drafted with, {mtp_bytes / GIB:.2f} GiB per "
               f"GPU ({'read' if weights.from_headers else 'derived from config.json'}) and their KV pages")
        if not mtp_layers:
            unknown.append(f"speculative decoding ({method}): {model.name}'s config has no MTP layers "
                           "(num_nextn_predict_layers); nothing drafted with is counted")
    elif method in DRAFT_HEAD_METHODS:
        layers = DRAFT_HEAD_METHODS[method]
        settings = SpeculativeSettings(tokens, layers, 0)
        how = f"{method}: {layers} draft layer(s) with KV pages"
        unknown.append(f"speculative decoding ({method}): the weights of {draft} are not counted: the "
                       "target's config does not size another checkpoint (library callers pass "
                       "SpeculativeSettings(draft_weight_bytes=...))")
    else:
        settings = SpeculativeSettings(tokens, 0, 0)
        how = f"{method}: a separate draft model"
        unknown.append(f"speculative decoding ({method}): the weights and KV pages of {draft} are not "
                       "counted: the target's config does not size another model (library callers pass "
                       "SpeculativeSettings(draft_weight_bytes=..., draft_layers=...))")
    line = (f"--speculative-config: {how}; {tokens} speculative token(s) per step "
            "(the rejection sampler's logits after the KV cache)")
    return settings, line, tuple(unknown)


@dataclass(frozen=True)
class MemoryTerm:
    """One line of vLLM's accounting on one GPU."""

    name: str
    bytes: int
    how: str
    """``read`` (from the checkpoint files), ``derived`` (computed from config and settings),
    ``measured`` (a constant measured on a real startup), or ``not counted`` (outside the budget)."""
    source: str

    def line(self) -> str:
        return f"{self.name}: {self.bytes / GIB:.2f} GiB ({self.how}; {self.source})"


@dataclass(frozen=True)
class MemoryPlan:
    """What one GPU of the layout holds, as vLLM will account for it."""

    total_bytes: int
    budget_bytes: int
    terms: tuple[MemoryTerm, ...]
    kv_cache_bytes: int
    kv_bytes_per_token: int
    kv_tokens: int
    max_model_len: int | None
    max_num_seqs: int
    max_num_batched_tokens: int
    outside_budget: tuple[MemoryTerm, ...] = ()
    """Terms vLLM allocates after sizing the KV cache, from the ``1 - utilization`` headroom."""
    rule_set: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)
    unknowns: tuple[str, ...] = field(default_factory=tuple)
    """What the plan could not count from the config (a draft model's weights): the verdict warns."""

    @property
    def non_kv_bytes(self) -> int:
        return sum(t.bytes for t in self.terms)

    def term(self, name: str) -> MemoryTerm:
        return next(t for t in (*self.terms, *self.outside_budget) if t.name == name)

    @property
    def max_concurrency(self) -> float | None:
        if not self.max_model_len:
            return None
        blocks = self.kv_tokens // KV_BLOCK_SIZE
        return blocks / math.ceil(self.max_model_len / KV_BLOCK_SIZE)

    def lines(self) -> list[str]:
        """The accounting in GiB, one line per term, for verdict details."""
        budget = (f"budget: {self.budget_bytes / GIB:.2f} GiB = ceil({self.total_bytes / GIB:.2f} GiB x "
                  "gpu_memory_utilization) (vllm/v1/worker/utils.py:request_memory)")
        kv = (f"KV cache: {self.kv_cache_bytes / GIB:.2f} GiB = budget - the terms above; "
              f"/ {self.kv_bytes_per_token:,} bytes per token = {self.kv_tokens:,} tokens")
        return [budget, *(f"- {t.line()}" for t in self.terms), kv,
                *(f"outside the budget: {t.line()}" for t in self.outside_budget), *self.notes]


# ---------------------------------------------------------------- defaults per GPU and version

def default_max_num_seqs(total_bytes: int, gpu_name: str = "") -> int:
    """``EngineArgs.get_batch_defaults``: 1024 on GPUs with >= 70 GiB that are not A100s, else 256
    (``vllm/engine/arg_utils.py``, 0.17.0:L1945-2025; unchanged in 0.19-0.32)."""
    if total_bytes >= 70 * GIB and "A100" not in gpu_name:
        return 1024
    return 256


def default_max_num_batched_tokens(total_bytes: int, gpu_name: str = "", api_server: bool = True) -> int:
    """Same source: 8192 (``vllm serve``) / 16384 (``LLM``) on >= 70 GiB non-A100 GPUs, else 2048 / 8192."""
    if total_bytes >= 70 * GIB and "A100" not in gpu_name:
        return 8192 if api_server else 16384
    return 2048 if api_server else 8192


def _uses_v2_runner(model: ModelSpec, version: VllmVersion | None) -> bool:
    if version is None or version.at_least(0, 32):
        return True
    if version.at_least(0, 25):
        return not model.is_moe and not _is_hybrid(model)
    return False


def _is_hybrid(model: ModelSpec) -> bool:
    text = model.config.get("text_config") or {}
    layer_types = model.config.get("layer_types") or text.get("layer_types") or []
    return isinstance(layer_types, list) and any("linear" in str(t) or "mamba" in str(t) for t in layer_types)


def cudagraph_counted(model: ModelSpec, version: VllmVersion | None) -> tuple[bool, str]:
    """Whether vLLM takes its CUDA-graph estimate off the KV cache, and why (module doc)."""
    if version is not None and not version.at_least(0, 25):
        return False, ("vLLM <= 0.24 captures CUDA graphs after sizing the KV cache "
                       "(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to 0 in envs.py, read in 0.19.0)")
    if _uses_v2_runner(model, version) and version is not None and not version.at_least(0, 32):
        return False, ("vLLM 0.25's V2 model runner returns 0 from profile_cudagraph_memory "
                       "(v1/worker/gpu/model_runner.py)")
    return True, ("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 by default and the "
                  f"{'V2' if _uses_v2_runner(model, version) else 'V1'} runner estimates graph memory "
                  "(gpu_worker.py:determine_available_memory, 0.25.0 / 0.32.0)")


# ---------------------------------------------------------------- the terms

def _activation_dtype_bytes(model: ModelSpec, settings: ServeArgs) -> int:
    name = model.torch_dtype if settings.dtype == "auto" else settings.dtype
    return 4 if name in ("float32", "float") else 2


def routed_expert_bytes(model: ModelSpec, weights: Weights) -> int:
    """The routed experts' share of the loaded weights: derived from the architecture
    (:func:`derive_weights`), scaled to the checkpoint's real loaded bytes."""
    if not model.is_moe:
        return 0
    derived = derive_weights(model)
    loaded_derived = derived.total_bytes - derived.unused_bytes
    if derived.routed_expert_bytes <= 0 or loaded_derived <= 0:
        return 0
    loaded = weights.total_bytes - weights.unused_bytes
    return int(derived.routed_expert_bytes * loaded / loaded_derived)


def weights_term(model: ModelSpec, tp: int, pp: int, settings: ServeArgs) -> MemoryTerm:
    """Weights on the most loaded GPU, with ``--dtype float32`` and online ``--quantization fp8``.

    With data parallelism a MoE model's routed experts are split over TP x DP ranks (by TP
    without EP, by whole experts with it: ``FusedMoEParallelConfig.make``), the rest over TP."""
    weights: Weights = model.weights or derived_weights_for(model)
    per_gpu = weights.per_gpu_bytes(tp)
    how = "read" if weights.from_headers else "derived"
    notes = [weights.provenance()]
    dp = settings.dp
    experts = routed_expert_bytes(model, weights) if dp > 1 else 0
    if experts:
        per_gpu -= experts // max(1, tp) - experts // (max(1, tp) * dp)
        notes.append(f"DP={dp}: the routed experts ({experts / GIB:.1f} GiB, their share derived from "
                     f"config.json) are split over TP x DP = {tp * dp} ranks "
                     "(fused_moe/config.py:FusedMoEParallelConfig.make)")
    if pp > 1:
        # Layers split evenly over PP ranks (get_pp_indices); the embedding sits on the first rank
        # and the LM head on the last, so the biggest rank holds ceil(L/pp) layers and one of them.
        embed = model.vocab_size * model.hidden_size * 2 // max(1, tp)
        layers_part = max(0, per_gpu - 2 * embed)
        per_gpu = math.ceil(layers_part / model.num_layers * math.ceil(model.num_layers / pp)) + embed
        notes.append(f"PP={pp}: {math.ceil(model.num_layers / pp)} of {model.num_layers} layers on the "
                     "largest stage (vllm/distributed/utils.py:get_pp_indices)")
    quantized = model.quantization is not None
    if settings.dtype in ("float32", "float") and not quantized and model.torch_dtype != "float32":
        per_gpu *= 2
        notes.append("--dtype float32 doubles the 16-bit weights")
    if settings.quantization == "fp8" and not quantized:
        # Linear weights go to 1 byte; embeddings, LM head and norms stay 16-bit.
        embed_bytes = model.vocab_size * model.hidden_size * 2 * (1 if model.tie_word_embeddings else 2)
        linear = max(0, per_gpu - embed_bytes // max(1, tp))
        per_gpu = linear // (2 if settings.dtype not in ("float32", "float") else 4) + embed_bytes // max(1, tp)
        notes.append("--quantization fp8 stores the linear weights in 1 byte (Fp8LinearMethod, online)")
    return MemoryTerm("weights", per_gpu, how if len(notes) == 1 else "derived", "; ".join(notes))


def forward_activation_bytes(model: ModelSpec, tp: int, ep: bool, tokens: int, dtype_bytes: int,
                             dp: int = 1) -> int:
    """Live tensors at the widest point of one decoder layer in the profile's dummy forward pass.

    Dense MLP: residual, normed input and the down projection's output (3 x hidden), ``gate_up``
    output (2 x I / TP) and the activation output (I / TP). Fused MoE (``fused_moe.py`` workspaces, at most
    ``VLLM_FUSED_MOE_CHUNK_SIZE`` tokens at once): per routed token ``2N + N + hidden`` with
    ``N = I_moe / moe_tp`` (moe_tp = TP x DP without EP, 1 with it). Attention: the QKV output and
    the attention output.
    """
    hidden = model.hidden_size
    widest = 0
    if model.intermediate_size and model.dense_layer_count:
        widest = max(widest, tokens * (3 * hidden + 3 * model.intermediate_size // tp))
    if model.is_moe:
        moe_tp = 1 if ep else tp * max(1, dp)
        width = (model.moe_intermediate_size or 0) // moe_tp
        chunk = min(tokens, FUSED_MOE_CHUNK)
        topk = model.num_experts_per_tok or 1
        routed = chunk * topk * (3 * width + hidden)
        shared = tokens * 3 * (model.shared_expert_intermediate_size // tp)
        widest = max(widest, tokens * 3 * hidden + routed + shared)
    if model.is_mla:
        heads = model.num_attention_heads // tp
        q = heads * ((model.qk_nope_head_dim or 0) + (model.qk_rope_head_dim or 0))
        kv = heads * ((model.qk_nope_head_dim or 0) + (model.v_head_dim or 0))
        attention = tokens * (2 * hidden + q + kv + heads * (model.v_head_dim or 0))
    else:
        q = model.num_attention_heads * model.head_dim // tp
        kv = max(1, model.num_kv_heads // tp) * model.head_dim
        attention = tokens * (2 * hidden + q + 2 * kv + q)
    return max(widest, attention) * dtype_bytes


def sampler_bytes(model: ModelSpec, requests: int, version: VllmVersion | None = None) -> int:
    """The sampler run over ``requests`` dummy requests (:data:`SAMPLER_BYTES_PER_LOGIT`, ``_V2``)."""
    per_logit = SAMPLER_BYTES_PER_LOGIT_V2 if _uses_v2_runner(model, version) else SAMPLER_BYTES_PER_LOGIT
    return requests * model.vocab_size * per_logit


DS_MLA_BYTES_PER_TOKEN = {"fp8_ds_mla": 656, "nvfp4_ds_mla": 352}
"""Bytes per token per layer of the DeepSeek sparse-MLA pages, which pack NoPE, RoPE and scales into
one blob (``MLAAttention.get_kv_cache_spec``: ``state_content_bytes``,
``vllm/model_executor/layers/attention/mla_attention.py`` 0.32)."""


def nvfp4_head_bytes(head_size: int) -> int:
    """One KV head's bytes per token per side with ``--kv-cache-dtype nvfp4``: packed FP4 data and
    one FP8 scale per 16 elements, ``head_size // 2 + head_size // 16`` (``nvfp4_kv_cache_full_dim``,
    ``vllm/utils/torch_utils.py``; ``FlashInferBackend.customize_spec`` makes K and V one slot each)."""
    return head_size // 2 + head_size // 16


def kv_unsized_reason(model: ModelSpec, kv_cache_dtype: str) -> str | None:
    """Why this module cannot size the KV pages of ``kv_cache_dtype`` for ``model`` (the resolved
    dtype); None when it can."""
    if kv_cache_dtype == "nvfp4" and model.is_mla:
        return (f"the KV page of --kv-cache-dtype nvfp4 on an MLA model ({model.name}) is not modelled: vLLM "
                "sizes NVFP4 pages per KV head (FlashInfer), and an MLA latent's nvfp4 layout is nvfp4_ds_mla "
                "(352 bytes per token per layer)")
    if kv_cache_dtype == "nvfp4_ds_mla" and not model.is_mla:
        return (f"--kv-cache-dtype nvfp4_ds_mla is a DeepSeek sparse-MLA page layout; {model.name} has no MLA "
                "attention, and its page is not modelled")
    return None


def kv_bytes_per_token(model: ModelSpec, tp: int, kv_dtype_bytes: int, fp8_ds_mla: bool = False,
                       pp: int = 1, draft_layers: int = 0, *, kv_cache_dtype: str = "auto") -> int:
    """KV-cache bytes one token takes on one GPU (``AttentionSpec.real_page_size_bytes`` /
    ``MLAAttentionSpec``, ``vllm/v1/kv_cache_interface.py``): GQA ``2 x layers x max(1, kv_heads //
    tp) x head_dim x bytes``; MLA ``layers x (kv_lora_rank + qk_rope_head_dim) x bytes`` on every
    rank; with PP, the layers of the largest stage; a speculative draft's layers keep their own
    pages (``draft_layers``, on the last stage). ``kv_dtype_bytes`` is the KV element's size: with
    ``--kv-cache-dtype auto`` the *served* dtype's, so ``--dtype float32`` makes it 4.
    ``kv_cache_dtype`` (resolved) picks the packed layouts: ``nvfp4`` (:func:`nvfp4_head_bytes`
    per head) and the DeepSeek sparse-MLA pages (:data:`DS_MLA_BYTES_PER_TOKEN`); a layout
    :func:`kv_unsized_reason` names raises ValueError with that reason."""
    unsized = kv_unsized_reason(model, kv_cache_dtype)
    if unsized is not None:
        raise ValueError(unsized)
    layers = math.ceil(model.num_layers / max(1, pp)) + draft_layers
    if model.is_mla:
        if fp8_ds_mla:
            return layers * DS_MLA_BYTES_PER_TOKEN["fp8_ds_mla"]
        if kv_cache_dtype in DS_MLA_BYTES_PER_TOKEN:
            return layers * DS_MLA_BYTES_PER_TOKEN[kv_cache_dtype]
        return layers * (model.mla_head_size or 0) * kv_dtype_bytes
    heads = max(1, model.num_kv_heads // tp)
    if kv_cache_dtype == "nvfp4":
        return 2 * layers * heads * nvfp4_head_bytes(model.head_dim)
    return 2 * layers * heads * model.head_dim * kv_dtype_bytes


def warm_up_terms(model: ModelSpec, requests: int, version: VllmVersion | None, dtype_bytes: int,
                  speculative: SpeculativeSettings | None = None) -> list[MemoryTerm]:
    """What ``compile_or_warm_up_model`` allocates after the KV cache: the sampler's buffers over
    ``requests`` dummy requests x vocab (kept: preallocated for the largest batch), plus, with
    speculative decoding, the rejection sampler's ``requests x vocab`` target logits (module doc)."""
    # With --dtype float32 the lm_head's logits are float32 already and the sampler's float32 copy
    # is the same tensor: 2 bytes per logit fewer; the bf16 figure is kept as the upper bound.
    sampler = sampler_bytes(model, requests, version)
    how = (f"{requests:,} dummy requests x vocab {model.vocab_size:,} "
           f"({SAMPLER_BYTES_PER_LOGIT_V2 if _uses_v2_runner(model, version) else SAMPLER_BYTES_PER_LOGIT} "
           "bytes per logit), allocated after the KV cache (gpu_worker.py:compile_or_warm_up_model, "
           "_dummy_sampler_run)")
    spec = speculative
    if spec is not None and spec.num_speculative_tokens:
        sampler += requests * model.vocab_size * dtype_bytes
        how += "; + the rejection sampler's target logits, one draft token per request"
    return [MemoryTerm("sampler warm-up", sampler, "derived", how)]


def unmodelled_reason(version: VllmVersion | None) -> str | None:
    """Why this module has no figures for ``version`` (None when it has): releases before
    :data:`MODELLED_SINCE` sized the KV cache with the V0 engine's profiler."""
    if version is None or version.at_least(*MODELLED_SINCE):
        return None
    return (f"vLLM {version} is not modelled: the memory accounting covers vLLM "
            f"{MODELLED_SINCE[0]}.{MODELLED_SINCE[1]} to {NEWEST_READ[0]}.{NEWEST_READ[1]} (the V1 engine's "
            "Worker.determine_available_memory); before 0.11 the V0 engine's profile run sized the KV "
            "cache differently (it over-predicts by 28-70% on a 24 GB GPU)")


def plan_memory(
    model: ModelSpec,
    total_bytes: int,
    settings: ServeArgs,
    *,
    kv_dtype_bytes: int = 2,
    fp8_ds_mla: bool = False,
    version: VllmVersion | None = None,
    gpu_name: str = "",
    api_server: bool = True,
    speculative: SpeculativeSettings | None = None,
) -> MemoryPlan:
    """vLLM's accounting for one GPU of ``total_bytes`` (as CUDA reports it) for the serve
    arguments ``settings`` (TP, PP, DP, EP and the engine settings, all from the declaration);
    ``api_server`` False is the ``LLM`` class, whose default max_num_batched_tokens differs;
    ``speculative`` is a draft's memory (:func:`speculative_settings` of the serve arguments'
    ``--speculative-config``, or a library caller's own figures)."""
    tp, ep, pp = settings.tp, settings.ep, settings.pp
    budget = math.ceil(total_bytes * settings.gpu_memory_utilization)
    seqs = settings.max_num_seqs or default_max_num_seqs(total_bytes, gpu_name)
    batched = settings.max_num_batched_tokens or default_max_num_batched_tokens(
        total_bytes, gpu_name, api_server)
    dtype_bytes = _activation_dtype_bytes(model, settings)
    requests = min(seqs, batched)
    dp = settings.dp
    forward = forward_activation_bytes(model, tp, ep, batched, dtype_bytes, dp)
    sampler = sampler_bytes(model, requests, version)
    mode = "eager" if settings.enforce_eager else "compiled"
    spec = speculative
    weights = weights_term(model, tp, pp, settings)
    if spec is not None and spec.draft_weight_bytes:
        weights = MemoryTerm("weights", weights.bytes + spec.draft_weight_bytes, "derived",
                             f"{weights.source}; + {spec.draft_weight_bytes / GIB:.2f} GiB of the speculative "
                             "draft's weights")
    terms = [
        weights,
        MemoryTerm("activation peak", max(forward, sampler), "derived",
                   f"profile run, {mode}: max(forward over max_num_batched_tokens={batched:,} "
                   f"{forward / GIB:.2f} GiB, sampler over {requests:,} dummy requests x vocab "
                   f"{model.vocab_size:,} {sampler / GIB:.2f} GiB) (gpu_model_runner.py:profile_run, "
                   "_dummy_sampler_run)"),
    ]
    non_torch = BASE_NON_TORCH_BYTES
    where = "TP=1 base, measured on the H200 with vLLM 0.25.0"
    if tp * pp > 1:
        non_torch += COMMUNICATOR_BYTES
        where += (f"; + {COMMUNICATOR_BYTES / GIB:.1f} GiB NCCL / custom all-reduce at TP x PP = {tp * pp} "
                  "(measured, H100, vLLM 0.19)")
    elif dp > 1 and model.is_moe:
        # The MoE layers of DP engines talk over a TP x DP (or EP) group: the same kind of
        # communicator, its size taken as the TP one's (not measured at DP).
        non_torch += COMMUNICATOR_BYTES
        where += (f"; + {COMMUNICATOR_BYTES / GIB:.1f} GiB NCCL for the MoE layers' group over DP={dp} "
                  "(the TP figure, not measured at DP)")
    terms.append(MemoryTerm("non-torch", non_torch, "measured", where))
    graphs = 0 if settings.enforce_eager else CUDAGRAPH_BYTES_PER_LAYER * math.ceil(model.num_layers / pp)
    outside: list[MemoryTerm] = []
    counted, why = cudagraph_counted(model, version)
    if graphs:
        graph_term = MemoryTerm("CUDA graphs", graphs, "measured",
                                f"{CUDAGRAPH_BYTES_PER_LAYER / MIB:.0f} MiB per layer, measured on the H200 "
                                f"with vLLM 0.25.0; {why}")
        (terms if counted else outside).append(graph_term)
    # The sampler warms up on the last PP rank only (get_pp_group().is_last_rank); with PP > 1 the
    # GPU judged here is taken as that rank (it holds the LM head, see weights_term).
    outside.extend(warm_up_terms(model, requests, version, dtype_bytes, speculative))
    kv_cache = budget - sum(t.bytes for t in terms)
    per_token = kv_bytes_per_token(model, tp, kv_dtype_bytes, fp8_ds_mla, pp,
                                   spec.draft_layers if spec is not None else 0,
                                   kv_cache_dtype=settings.kv_cache_dtype)
    tokens = 0
    if kv_cache > 0:
        blocks = kv_cache // (per_token * KV_BLOCK_SIZE)
        tokens = blocks * KV_BLOCK_SIZE
    notes = []
    if settings.enforce_eager:
        notes.append("--enforce-eager: no CUDA graphs, no torch.compile")
    if model.weights is None or model.weights.read_from == DERIVED:
        notes.append("weights derived from config.json, not read from the checkpoint")
    rule_set = _rule_set(version)
    return MemoryPlan(total_bytes, budget, tuple(terms), max(0, kv_cache), per_token, tokens,
                      settings.max_model_len or model.max_position_embeddings, seqs, batched,
                      tuple(outside), rule_set, tuple(notes))


def _rule_set(version: VllmVersion | None) -> str:
    if version is None:
        return ("vLLM memory accounting of 0.32 (vLLM version unknown, newest assumed; pass "
                "--vllm-version)")
    if version.release[:2] > NEWEST_READ:
        return (f"vLLM >= 0.32 memory accounting (vLLM {version} is newer than the newest read, "
                f"{NEWEST_READ[0]}.{NEWEST_READ[1]}: its rules assumed)")
    if version.at_least(0, 32):
        return f"vLLM >= 0.32 memory accounting (vLLM {version})"
    if version.at_least(0, 25):
        return f"vLLM 0.25-0.31 memory accounting (vLLM {version})"
    return f"vLLM <= 0.24 memory accounting (vLLM {version})"
