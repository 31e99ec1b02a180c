"""How a deployment spreads a model over GPUs: TP, PP, DP, expert parallelism and the KV dtype.

Every load-time rule of vLLM is a function of the checkpoint and of this layout (plus the GPU's
compute capability and the vLLM version), so the rules in :mod:`pytest_gpuready.model.rules`
take one :class:`Layout` rather than a growing list of keyword arguments, and the planner builds
one per row it considers.

The sizes follow vLLM's ``ParallelConfig`` (``vllm/config/parallel.py``): ``world_size`` is
TP x PP (one engine), each of the DP engines takes that many GPUs, and MoE layers are split by
``FusedMoEParallelConfig.make`` (``vllm/model_executor/layers/fused_moe/config.py``): without
``--enable-expert-parallel`` the MoE TP size is TP x DP; with it, each of TP x DP ranks holds
whole experts (MoE TP size 1, EP size TP x DP).
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_gpuready.model.backends import KV_CACHE_DTYPES


@dataclass(frozen=True)
class Layout:
    """One way to lay a model out: ``vllm serve -tp TP -pp PP -dp DP [--enable-expert-parallel]``."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: bool = False
    """``--enable-expert-parallel``."""
    kv_cache_dtype: str = "auto"
    """``--kv-cache-dtype`` as given (``auto`` resolves through the checkpoint, see
    :func:`pytest_gpuready.model.checks.effective_kv_cache_dtype`)."""

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Layout {name}={value!r}: expected a whole number >= 1")
        if not isinstance(self.ep, bool):
            raise ValueError(f"Layout ep={self.ep!r}: expected true or false")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"Layout kv_cache_dtype={self.kv_cache_dtype!r}: expected one of "
                             f"{', '.join(KV_CACHE_DTYPES)}")

    @property
    def world_size(self) -> int:
        """GPUs of one engine: TP x PP (``ParallelConfig.world_size``)."""
        return self.tp * self.pp

    @property
    def total_gpus(self) -> int:
        """GPUs of the whole deployment: DP engines of TP x PP each."""
        return self.tp * self.pp * self.dp

    @property
    def moe_tp_size(self) -> int:
        """How many ways each expert's FFN is split: 1 with EP, else TP x DP."""
        return 1 if self.ep else self.tp * self.dp

    @property
    def ep_size(self) -> int:
        """How many ranks the experts are spread over: TP x DP with EP, else 1."""
        return self.tp * self.dp if self.ep else 1

    def describe(self) -> str:
        """``TP=8+EP``, ``TP=4 PP=2``, ``DP=2 TP=4+EP KV fp8`` (what a planner row shows)."""
        parts = []
        if self.dp > 1:
            parts.append(f"DP={self.dp}")
        parts.append(f"TP={self.tp}" + ("+EP" if self.ep else ""))
        if self.pp > 1:
            parts.append(f"PP={self.pp}")
        if self.kv_cache_dtype != "auto":
            parts.append(f"KV {self.kv_cache_dtype}")
        return " ".join(parts)

    def vllm_args(self) -> list[str]:
        """The ``vllm serve`` flags of this layout (defaults left out)."""
        args = ["--tensor-parallel-size", str(self.tp)]
        if self.pp > 1:
            args += ["--pipeline-parallel-size", str(self.pp)]
        if self.dp > 1:
            args += ["--data-parallel-size", str(self.dp)]
        if self.ep:
            args.append("--enable-expert-parallel")
        if self.kv_cache_dtype != "auto":
            args += ["--kv-cache-dtype", self.kv_cache_dtype]
        return args
