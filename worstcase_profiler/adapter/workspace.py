"""vLLM's WorkspaceManager (vllm/v1/worker/workspace.py): read every (ubatch, lane) slot, grow
them all to the worst case seen on any slot, lock after warm-up: a second execution lane the
stock profile never exercises gets the worst case too.

Private attributes used, by version (docs/vllm-hooks.md):
  `_current_workspaces` (list of uint8 tensors or None, one per slot): 0.26-0.33
  `_num_lanes`: 0.28+ (0.26-0.27 have no lanes: slot = ubatch)
  `_get_workspace_id`: 0.31+; 0.28-0.30 have lanes without it: the slot is computed from the
      ubatch id and the lane ContextVar
  `_alloc_context`: 0.32+ (the sleep-mode "workspace" pool): slots are grown inside it
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
    target = max([*slot_sizes(mgr), at_least])
    return _rewrite_slots(mgr, target, only_smaller=True)


def resize_all_slots(mgr, size: int) -> list[WorkspaceSlot]:
    """Every slot to exactly `size` bytes (the chunk cap's workspace: smaller than the sweep
    grew), written so the memory is real on the CPU too; the larger tensors are released."""
    return _rewrite_slots(mgr, size, only_smaller=False)


def _rewrite_slots(mgr, size: int, *, only_smaller: bool) -> list[WorkspaceSlot]:
    """Each slot of another size (with `only_smaller`, of a smaller one) replaced by a zeroed
    tensor of `size` bytes in vLLM's allocation context; the slots as they were and are."""
    # vllm-touch: workspace-slots
    import contextlib

    import torch

    lanes = int(getattr(mgr, "_num_lanes", 1))
    alloc_context = getattr(mgr, "_alloc_context", None) or contextlib.nullcontext
    out = []
    for i, was in enumerate(slot_sizes(mgr)):
        if was < size or (was != size and not only_smaller):
            mgr._current_workspaces[i] = None
            with alloc_context():
                mgr._current_workspaces[i] = torch.zeros(size, dtype=torch.uint8,
                                                         device=mgr._device)
        out.append(WorkspaceSlot(ubatch=i // lanes, lane=i % lanes, bytes_before=was,
                                 bytes_after=_nbytes(mgr._current_workspaces[i])))
    return out


def total_bytes(mgr) -> int:
    return sum(slot_sizes(mgr)) if mgr is not None else 0


def lock(mgr) -> None:
    # vllm-touch: workspace-slots
    mgr.lock()


def slot_id_fn(mgr):
    """The function that says which slot the caller's allocation lands in: vLLM's own (0.31+),
    else ubatch * lanes + lane from the ubatch id and the lane ContextVar (0.28-0.30), else the
    ubatch alone (0.26-0.27, no lanes)."""
    # vllm-touch: workspace-recorder
    own = getattr(mgr, "_get_workspace_id", None)
    if own is not None:
        return own
    try:
        from vllm.v1.worker import ubatching
        from vllm.v1.worker import workspace as wsmod
    except ImportError:
        return lambda: 0
    ubatch = getattr(ubatching, "dbo_current_ubatch_id", lambda: 0)
    lanes = int(getattr(mgr, "_num_lanes", 1))
    lane_var = getattr(wsmod, "_workspace_lane", None)
    return lambda: int(ubatch()) * lanes + (int(lane_var.get()) if lane_var is not None else 0)


class RequestRecorder:
    """Records what each (ubatch, lane) slot was asked for during one step, by wrapping the
    manager's `_ensure_workspace_size` on the instance. Slot sizes alone cannot say what a step
    needs once an earlier step has grown the slot."""

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
        slot_of = slot_id_fn(mgr)

        def ensure(required_bytes, *a, **kw):
            sid = slot_of()
            self.per_slot[sid] = max(self.per_slot.get(sid, 0), int(required_bytes))
            return original(required_bytes, *a, **kw)

        mgr._ensure_workspace_size = ensure
        return self

    def __exit__(self, *exc) -> None:
        # vllm-touch: workspace-recorder
        if self._mgr is not None:
            self._mgr.__dict__.pop("_ensure_workspace_size", None)
