"""Parallel sizes against the GPUs and the model: world size, TP divisibility, expert parallelism.

- World size: ``ParallelConfig.__post_init__`` (``vllm/config/parallel.py``, 0.13-0.33) raises
  ``World size (TP x PP) is larger than the number of available GPUs (G) in this node.`` while
  the config is built. Data-parallel engines each take TP x PP more GPUs; with
  ``CUDA_VISIBLE_DEVICES`` set, the first DP rank without GPUs fails in
  ``get_physical_gpu_ids_for_local_dp_rank`` (``vllm/v1/engine/utils.py``) with
  ``Error computing device indices for CUDA_VISIBLE_DEVICES: local range: [a, b) ...``.
- TP divisibility: :func:`pytest_gpuready.model.checks.check_tp_divisibility`, in vLLM's order
  (heads at config time, then the vocab, then layer by layer).
- Expert parallelism: ``--enable-expert-parallel`` on a dense model raises ``Number of experts in
  the model must be greater than 0 when expert parallelism is enabled.``
  (``ModelConfig._verify_with_expert_parallelism``, ``vllm/config/model.py``); otherwise experts
  are spread as evenly as they go (``determine_expert_map``: the first ``E % EP`` ranks hold one
  more), which is only an error with ``--enable-eplb`` (not modelled).
"""

from __future__ import annotations

from pytest_gpuready.model.checks import check_tp_divisibility
from pytest_gpuready.model.rules.common import CONFIG, Capability, staged
from pytest_gpuready.model.serve_args import Layout
from pytest_gpuready.model.spec import ModelSpec
from pytest_gpuready.model.vllm_version import VllmVersion
from pytest_gpuready.verdict import Verdict

PARALLEL_RULES = "vLLM parallel-config rules (unchanged 0.13-0.33)"
WORLD_SIZE_HINT = ("If this is intentional and you are using:\n- ray, set '--distributed-executor-backend ray'.\n"
                   "- multiprocessing, set '--nnodes' appropriately.")


def check_world_size(layout: Layout, visible_gpus: int | None,
                     vllm_version: VllmVersion | str | None = None) -> Verdict:
    """Do DP engines of TP x PP GPUs each fit on the GPUs this node makes visible?"""
    evidence = {"world_size": layout.world_size, "total_gpus": layout.total_gpus, "visible_gpus": visible_gpus}
    if visible_gpus is None:
        return Verdict.undecided(
            f"{layout.describe()} needs {layout.total_gpus} GPUs; how many this node has is not known",
            needs="the number of visible GPUs (pass --gpu-host HOST or --gpu-ids)", evidence=evidence,
            rule_set=PARALLEL_RULES)
    if layout.world_size > visible_gpus:
        return staged(Verdict.failed(
            f"World size ({layout.world_size}) is larger than the number of available GPUs "
            f"({visible_gpus}) in this node.",
            details=(f"TP={layout.tp} x PP={layout.pp} = {layout.world_size} GPUs per engine, "
                     f"{visible_gpus} visible", *WORLD_SIZE_HINT.splitlines()),
            evidence=evidence, rule_set=PARALLEL_RULES), CONFIG, 0, 0)
    if layout.total_gpus > visible_gpus:
        rank = visible_gpus // layout.world_size
        start, stop = rank * layout.world_size, (rank + 1) * layout.world_size
        visible = ",".join(str(i) for i in range(visible_gpus))
        return staged(Verdict.failed(
            f"Error computing device indices for CUDA_VISIBLE_DEVICES: local range: [{start}, {stop}) "
            f'base value: "{visible}"',
            details=(f"DP={layout.dp} engines x TP={layout.tp} x PP={layout.pp} = {layout.total_gpus} GPUs, "
                     f"{visible_gpus} visible: DP rank {rank} gets none",
                     "without CUDA_VISIBLE_DEVICES the same engine fails in its worker instead: "
                     f"DP adjusted local rank {start} is out of bounds"),
            evidence=evidence, rule_set=PARALLEL_RULES), CONFIG, 0, 0)
    return Verdict.passed(f"{layout.describe()} uses {layout.total_gpus} of {visible_gpus} GPUs",
                          evidence=evidence, rule_set=PARALLEL_RULES)


def check_tensor_parallel(model: ModelSpec, layout: Layout, capability: Capability | str | None = None,
                          vllm_version: VllmVersion | str | None = None) -> Verdict:
    """:func:`check_tp_divisibility` for the layout (the MoE TP size includes DP)."""
    verdict = check_tp_divisibility(model, layout.tp, ep=layout.ep)
    moe_tp = layout.moe_tp_size
    if verdict.ok and model.is_moe and not layout.ep and layout.dp > 1 and model.moe_intermediate_size:
        width = model.moe_intermediate_size
        if width % moe_tp:
            return staged(Verdict.failed(
                f"{model.name} cannot be split at {layout.describe()}: {width} is not divisible by {moe_tp}: "
                f"expert FFN {model.expert_ffn_key} {width} is split over TP x DP = {moe_tp} MoE ranks",
                evidence=dict(verdict.evidence), rule_set=verdict.rule_set), 1, model.dense_layer_count, 2)
    return verdict


def check_expert_parallel(model: ModelSpec, layout: Layout, capability: Capability | str | None = None,
                          vllm_version: VllmVersion | str | None = None) -> Verdict:
    """EP needs a MoE model; how the experts spread over the EP ranks."""
    if not layout.ep:
        return Verdict.passed(f"expert parallelism is off at {layout.describe()}", rule_set=PARALLEL_RULES)
    evidence = {"ep_size": layout.ep_size, "experts": model.num_experts}
    if not model.is_moe:
        return staged(Verdict.failed(
            f"{model.name} does not load with --enable-expert-parallel: Number of experts in the model must "
            "be greater than 0 when expert parallelism is enabled.", evidence=evidence,
            rule_set=PARALLEL_RULES), CONFIG, 0, 1)
    per, extra = divmod(model.num_experts, layout.ep_size)
    spread = (f"{model.num_experts} experts over {layout.ep_size} EP ranks: {per} each"
              + (f", the first {extra} ranks one more" if extra else ""))
    warnings: tuple[str, ...] = ()
    if per == 0:
        warnings = (f"{layout.ep_size} EP ranks for {model.num_experts} experts: "
                    f"{layout.ep_size - model.num_experts} ranks hold no expert",)
    return Verdict.passed(f"{model.name}: {spread}", evidence=evidence, warnings=warnings,
                          rule_set=PARALLEL_RULES)
