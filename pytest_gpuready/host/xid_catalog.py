"""NVIDIA's Xid catalog, the common rows: what an Xid means and what NVIDIA says to do first.

Why it exists: an Xid number alone tells an operator nothing; a failed launch that says "Xid 79,
GPU has fallen off the bus: NVIDIA's immediate action RESTART_BM (reboot the node)" tells them
what to do. One table serves the kernel-log history check (``health_checks``) and the live
watcher during launches and benchmarks (``xid_watch``).

Source: NVIDIA, "Analyzing Xid Errors with the Xid Catalog",
https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html (Ampere and newer), columns
*Mnemonic*, *Description*, *Resolution Bucket (Immediate Action)*; read as mirrored row by row in
leptonai/gpud ``components/accelerator/nvidia/xid/catalog_generated.go`` (commit 73e270e3,
generated 2025-10-29 from that page). The plain-words gloss of each bucket is ours.
"""

from __future__ import annotations

from dataclasses import dataclass

XID_CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"


@dataclass(frozen=True)
class XidEntry:
    """One catalog row: the Xid, NVIDIA's mnemonic and description, and the immediate-action bucket."""

    xid: int
    mnemonic: str
    description: str
    immediate_action: str


BUCKETS: dict[str, str] = {
    "RESTART_APP": "restart the application",
    "RESET_GPU": "reset the GPU (drain it first)",
    "RESTART_BM": "reboot the node; if it repeats, contact support to reseat or replace the GPU",
    "IGNORE": "no action needed at once; watch whether it repeats",
    "CONTACT_SUPPORT": "contact NVIDIA support",
    "WORKFLOW_XID_45": "look at the Xid logged before it: this one is the clean-up after it",
    "WORKFLOW_XID_48": "double-bit ECC error: reset the GPU; a recurring one means RMA",
    "WORKFLOW_NVLINK_ERR": "reset the GPU; if it repeats, the NVLink or board needs service",
    "XID_154": "the GPU's recovery action changed: read nvidia-smi's gpu_recovery_action",
}
"""The catalog's resolution buckets in plain words (our gloss)."""

_ROWS: tuple[tuple[int, str, str, str], ...] = (
    (8, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "GPU stopped processing", "RESTART_APP"),
    (13, "ROBUST_CHANNEL_GR_EXCEPTION", "Graphics Engine Exception", "RESTART_APP"),
    (31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault", "RESTART_APP"),
    (32, "ROBUST_CHANNEL_PBDMA_ERROR", "Invalid or corrupted push buffer stream", "RESTART_APP"),
    (43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "GPU stopped processing", "IGNORE"),
    (45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "Preemptive cleanup, due to previous errors", "WORKFLOW_XID_45"),
    (46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "GPU stopped processing", "RESET_GPU"),
    (48, "ROBUST_CHANNEL_GPU_ECC_DBE", "Double Bit ECC Error", "WORKFLOW_XID_48"),
    (62, "PMU_HALT_ERROR", "Internal micro-controller halt", "RESET_GPU"),
    (63, "INFOROM_DRAM_RETIREMENT_EVENT", "GPU memory remapping event", "IGNORE"),
    (64, "INFOROM_DRAM_RETIREMENT_FAILURE", "GPU memory remapping failure", "RESET_GPU"),
    (74, "NVLINK_ERROR", "NVLINK Error", "WORKFLOW_NVLINK_ERR"),
    (79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus", "RESTART_BM"),
    (92, "EXCESSIVE_SBE_INTERRUPTS", "High single-bit ECC error rate", "IGNORE"),
    (94, "ROBUST_CHANNEL_CONTAINED_ERROR", "Contained memory error", "RESTART_APP"),
    (95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "Uncontained memory error", "RESET_GPU"),
    (109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "Context Switch Timeout Error", "RESET_GPU"),
    (119, "GSP_RPC_TIMEOUT", "GSP RPC Timeout", "RESET_GPU"),
    (120, "GSP_ERROR", "GSP Error", "RESET_GPU"),
    (140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "ECC Unrecovered Error", "RESET_GPU"),
    (143, "GPU_INIT_ERROR", "GPU Initialization Error", "RESET_GPU"),
    (154, "GPU_RECOVERY_ACTION_CHANGED", "GPU Recovery Action Changed", "XID_154"),
)

XID_CATALOG: dict[int, XidEntry] = {row[0]: XidEntry(*row) for row in _ROWS}
"""The common Xids of NVIDIA's catalog (module docstring for the source)."""


def xid_action(xid: int) -> str:
    """``ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS, GPU has fallen off the bus: NVIDIA's immediate
    action RESTART_BM (reboot the node; ...)``; an Xid outside the table points to the catalog."""
    entry = XID_CATALOG.get(xid)
    if entry is None:
        return f"not in the plugin's table of common Xids: see NVIDIA's Xid catalog, {XID_CATALOG_URL}"
    gloss = BUCKETS.get(entry.immediate_action, "see NVIDIA's Xid catalog")
    return (f"{entry.mnemonic}, {entry.description}: NVIDIA's immediate action "
            f"{entry.immediate_action} ({gloss})")


__all__ = ["BUCKETS", "XID_CATALOG", "XID_CATALOG_URL", "XidEntry", "xid_action"]
