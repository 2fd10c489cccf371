"""vLLM's WorkspaceManager (vllm/v1/worker/workspace.py): read every (ubatch, lane) slot, grow
them all to the worst case seen on any slot, lock after warm-up (seed 002).

Private attributes used, by version (docs/vllm-hooks.md §4):
  `_current_workspaces` (list of uint8 tensors or None, one per slot): 0.26, 0.32, 0.33
  `_num_lanes`: 0.32, 0.33 (0.26 has no lanes: slot = ubatch)
The CPU worker never initialises a manager; then there is nothing to grow or lock.
"""

from __future__ import annotations

from ..core.types import WorkspaceSlot


def manager():
    # vllm-touch: workspace-slots
    try:
        from vllm.v1.worker.workspace import (current_workspace_manager,
                                              is_workspace_manager_initialized)
    except ImportError:
        return None
    return current_workspace_manager() if is_workspace_manager_initialized() else None


def _nbytes(t) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def slot_sizes(mgr) -> list[int]:
    # vllm-touch: workspace-slots
    return [_nbytes(t) for t in mgr._current_workspaces]


def grow_all_slots(mgr, at_least: int = 0) -> list[WorkspaceSlot]:
    """Every slot to the largest size any slot reached (or `at_least`, what a cached sweep's
    slots reached). Written (zeroed), so the memory is real on the CPU too and the consumed
    figure read afterwards includes it."""
    # vllm-touch: workspace-slots
    import torch

    lanes = int(getattr(mgr, "_num_lanes", 1))
    before = slot_sizes(mgr)
    target = max([*before, at_least])
    out = []
    for i, size in enumerate(before):
        if size < target:
            mgr._current_workspaces[i] = None
            mgr._current_workspaces[i] = torch.zeros(target, dtype=torch.uint8,
                                                     device=mgr._device)
        out.append(WorkspaceSlot(ubatch=i // lanes, lane=i % lanes, bytes_before=size,
                                 bytes_after=_nbytes(mgr._current_workspaces[i])))
    return out


def total_bytes(mgr) -> int:
    return sum(slot_sizes(mgr)) if mgr is not None else 0


def lock(mgr) -> None:
    # vllm-touch: workspace-slots
    mgr.lock()


class RequestRecorder:
    """Records what each (ubatch, lane) slot was asked for during one step, by wrapping the
    manager's `_ensure_workspace_size` on the instance (0.26, 0.32, 0.33). Slot sizes alone
    cannot say what a step needs once an earlier step has grown the slot."""

    def __init__(self) -> None:
        self.per_slot: dict[int, int] = {}

    def total(self) -> int:
        return sum(self.per_slot.values())

    def __enter__(self) -> "RequestRecorder":
        # vllm-touch: workspace-recorder
        self.per_slot.clear()
        self._mgr = mgr = manager()
        if mgr is None:
            return self
        original = mgr._ensure_workspace_size
        slot_of = getattr(mgr, "_get_workspace_id", None)

        def ensure(required_bytes, *a, **kw):
            sid = slot_of() if slot_of is not None else 0
            self.per_slot[sid] = max(self.per_slot.get(sid, 0), int(required_bytes))
            return original(required_bytes, *a, **kw)

        mgr._ensure_workspace_size = ensure
        return self

    def __exit__(self, *exc) -> None:
        # vllm-touch: workspace-recorder
        if self._mgr is not None:
            self._mgr.__dict__.pop("_ensure_workspace_size", None)
