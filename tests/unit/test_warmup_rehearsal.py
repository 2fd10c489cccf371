"""The warm-up rehearsal's batch (adapter/warmup.rehearse, full_warm_up_batch): vLLM's V2 warm-up
runs as many requests as the KV cache's blocks hold, so on the provisional cache it ran 23 where
the real warm-up ran 831 and kept 2.3 GiB more (H200 run 19). Where vLLM can send every write to
the null block, the rehearsal sets that and measures the full batch. A stand-in runner whose
warm-up follows vLLM 0.32's cap (v1/worker/gpu/warmup.py) stands for vLLM."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

from worstcase_profiler.adapter import warmup

PER_REQUEST = 3 << 20  # what the stand-in warm-up keeps per request it ran


class Tables:  # vLLM 0.32's BlockTables: a class default the elastic-EP warm-up overrides
    redirect_writes_to_null_block = False
    num_kv_cache_groups = 4

    def __init__(self):
        self.staged: list[tuple[int, int, list[int]]] = []  # (request, group, block ids)

    def append_block_ids(self, req_index, new_block_ids, overwrite):  # block_table.py:110-129
        for g in range(self.num_kv_cache_groups):
            ids = new_block_ids[g]
            if self.redirect_writes_to_null_block:
                ids = [0] * len(ids)
            self.staged.append((req_index, g, list(ids)))


class OldTables:  # vLLM 0.26: no redirect
    pass


def _runner(tables, blocks=165, **kw):
    return SimpleNamespace(block_tables=tables, kv_cache_config=SimpleNamespace(num_blocks=blocks),
                           **kw)


def _rehearse(tables, *, blocks=165, blocks_per_request=7, max_num_seqs=1024):
    runner = _runner(tables, blocks)
    held = [0]

    def warm_up():  # warmup.py:296-311: the cap unless writes go to the null block
        n = max_num_seqs
        if not getattr(runner.block_tables, "redirect_writes_to_null_block", False):
            n = min(n, max(1, (blocks - 1) // blocks_per_request))
        held[0] += n * PER_REQUEST

    out = warmup.rehearse(SimpleNamespace(model_runner=runner), warm_up, lambda: held[0],
                          graphs=False)
    return out, runner


def test_the_rehearsal_runs_the_full_warm_up_batch_on_the_provisional_cache():
    out, runner = _rehearse(Tables())
    assert out.kept_bytes == 1024 * PER_REQUEST
    assert "redirect_writes_to_null_block" not in vars(runner.block_tables)
    assert runner.block_tables.redirect_writes_to_null_block is False


def test_without_the_redirect_the_rehearsal_keeps_what_the_blocks_allow():
    out, runner = _rehearse(OldTables())
    assert out.kept_bytes == 23 * PER_REQUEST  # the audit after the real warm-up is the check
    assert not hasattr(runner.block_tables, "redirect_writes_to_null_block")


def test_the_redirect_is_undone_when_the_warm_up_fails():
    runner = _runner(Tables())

    def failing():
        assert runner.block_tables.redirect_writes_to_null_block is True
        raise RuntimeError("warm-up failed")

    try:
        warmup.rehearse(SimpleNamespace(model_runner=runner), failing, lambda: 0, graphs=False)
    except RuntimeError:
        pass
    assert "redirect_writes_to_null_block" not in vars(runner.block_tables)
    assert "append_block_ids" not in vars(runner.block_tables)


def test_writes_go_to_a_scratch_block_per_group_never_the_null_block():
    """Block 0 is vLLM's padding marker: the GDN kernels skip a sequence whose state index is 0
    and leave empty() outputs unwritten (H200 run 20: the MTP hybrid's rehearsal never ended).
    Each group writes to a real block of its own instead, and a drafter's runner gets the full
    batch too."""
    tables = Tables()
    runner = _runner(tables, speculator=object())

    def warm_up():  # as warmup.py: the cap read from the flag, then distinct ids per request
        assert runner.block_tables.redirect_writes_to_null_block is True
        for r in range(3):
            tables.append_block_ids(r, tuple([10 * r + g + 1, 10 * r + g + 2] for g in range(4)),
                                    False)

    warmup.rehearse(SimpleNamespace(model_runner=runner), warm_up, lambda: 0, graphs=False)
    assert {(g, tuple(ids)) for _, g, ids in tables.staged} == \
        {(g, (1 + g, 1 + g)) for g in range(4)}
    assert len(tables.staged) == 12
    tables.append_block_ids(5, ([7], [8], [9], [10]), False)  # afterwards: vLLM's own again
    assert tables.staged[-4:] == [(5, 0, [7]), (5, 1, [8]), (5, 2, [9]), (5, 3, [10])]


def test_a_provisional_cache_without_a_spare_block_per_group_keeps_the_capped_batch():
    out, runner = _rehearse(Tables(), blocks=4)  # null block + 3 < 4 groups' scratch blocks
    assert out.kept_bytes == 1 * PER_REQUEST


def test_a_stalled_rehearsal_says_so_and_dumps_every_threads_stack(tmp_path, monkeypatch, caplog):
    import logging
    import sys
    import time

    log = open(tmp_path / "stderr", "w+")
    monkeypatch.setattr(sys, "stderr", log)
    with caplog.at_level(logging.WARNING, logger="vllm.wcprof"):
        with warmup.stall_watch("a test", after_s=0.2):
            time.sleep(0.6)
        with warmup.stall_watch("a quick one", after_s=0.5):
            pass
        time.sleep(0.7)
    log.flush()
    text = (tmp_path / "stderr").read_text()
    assert "test_a_stalled_rehearsal_says_so_and_dumps_every_threads_stack" in text
    assert [r.getMessage() for r in caplog.records if "has run for" in r.getMessage()] == \
        ["[wcprof] a test has run for 0 s: every thread's stack follows on stderr (a long "
         "warm-up is not necessarily a hang; it goes on)"]


def test_the_scratch_swap_takes_vllms_own_append_block_ids_signature():
    """The swap must pass through whatever vLLM's BlockTables.append_block_ids takes (review)."""
    import inspect

    bt = __import__("pytest").importorskip("vllm.v1.worker.gpu.block_table")
    params = list(inspect.signature(bt.BlockTables.append_block_ids).parameters)
    assert params[:3] == ["self", "req_index", "new_block_ids"]
    tables = Tables()
    runner = _runner(tables)

    def warm_up():
        tables.append_block_ids(0, ([5], [6], [7], [8]), overwrite=True)  # keyword, as vLLM may

    warmup.rehearse(SimpleNamespace(model_runner=runner), warm_up, lambda: 0, graphs=False)
    assert [ids for _, _, ids in tables.staged] == [[1], [2], [3], [4]]


def test_the_rehearsal_leaves_vllms_serving_checks_to_the_real_warm_up():
    calls = []

    class Worker:
        def _maybe_activate_jit_monitor(self):
            calls.append("jit")

        def compile_or_warm_up_model(self):
            self._maybe_activate_jit_monitor()
            module.enable_gpu_sync_check()

    with _worker_module(Worker, enable_gpu_sync_check=lambda: calls.append("sync")) as module:
        worker = Worker()
        worker.model_runner = SimpleNamespace(block_tables=OldTables())
        warmup.rehearse(worker, worker.compile_or_warm_up_model, lambda: 0, graphs=False)
        assert calls == []
        jit = __import__("pytest").importorskip("vllm.utils.jit_monitor")
        real, seen = jit.activate, []
        warmup.rehearse(worker, lambda: seen.append(jit.activate), lambda: 0, graphs=False)
        assert seen and seen[0] is not real and jit.activate is real  # 0.26's direct call
        worker.compile_or_warm_up_model()  # the real warm-up, afterwards
        assert calls == ["jit", "sync"]
        assert "_maybe_activate_jit_monitor" not in vars(worker)


@contextlib.contextmanager
def _worker_module(worker_cls, **functions):
    """A stand-in for vLLM's gpu_worker module holding `functions` at module level, registered
    in sys.modules for the duration, as the module `worker_cls`'s warm-up is defined in (the
    rehearsal replaces names in that module's globals)."""
    import sys
    import types

    module = types.ModuleType(f"fake_gpu_worker_{worker_cls.__qualname__}_{id(worker_cls)}")
    for name, fn in functions.items():
        setattr(module, name, fn)
    worker_cls.__module__ = worker_cls.compile_or_warm_up_model.__module__ = module.__name__
    sys.modules[module.__name__] = module
    try:
        yield module
    finally:
        del sys.modules[module.__name__]


def test_the_rehearsal_leaves_the_heap_freeze_to_the_real_warm_up():
    """vLLM's warm-up ends in freeze_gc_heap() (gc.freeze()). Run inside the rehearsal, it would
    freeze any reference cycle holding a view of the provisional KV cache, which the V1
    teardown's collection then could not free. The rehearsal defers it; a cycle made during the
    rehearsal is collected afterwards, and the real warm-up still freezes."""
    import gc
    import weakref

    class Cache:  # stands in for a KV tensor held by a cycle (a layer <-> its views)
        def __init__(self):
            self.me = self

    made = []

    class Worker:
        def compile_or_warm_up_model(self):
            made.append(weakref.ref(Cache()))  # a cycle only the collector frees
            module.freeze_gc_heap()

    with _worker_module(Worker, freeze_gc_heap=lambda: (gc.collect(), gc.freeze()),
                        maybe_attach_gc_debug_callback=lambda: None) as module:
        worker = Worker()
        worker.model_runner = SimpleNamespace(block_tables=OldTables())
        try:
            warmup.rehearse(worker, worker.compile_or_warm_up_model, lambda: 0, graphs=False)
            assert gc.get_freeze_count() == 0  # the rehearsal froze nothing
            gc.collect()
            assert made[0]() is None  # its cycle was collected
            worker.compile_or_warm_up_model()  # the real warm-up freezes as vLLM means it to
            assert gc.get_freeze_count() > 0
        finally:
            gc.unfreeze()  # never leave the heap frozen for later tests


def test_vllms_warm_up_still_ends_in_the_calls_the_rehearsal_defers():
    """The names replaced are the ones vLLM's GPU worker calls at the end of its warm-up (read
    from the installed vLLM's source: a rename would leave the freeze inside the rehearsal)."""
    import importlib.util
    import re

    __import__("pytest").importorskip("vllm")
    spec = importlib.util.find_spec("vllm.v1.worker.gpu_worker")
    if spec is None or not spec.origin:
        __import__("pytest").skip("vLLM's GPU worker is not installed")
    text = open(spec.origin).read()
    # 0.33 moved the body into _compile_or_warm_up_model (the public method wraps it)
    name = "def _compile_or_warm_up_model" if "def _compile_or_warm_up_model" in text else \
        "def compile_or_warm_up_model"
    body = text[text.index(name):]
    body = body[:re.search(r"\n    def ", body[1:]).start() + 1]
    for name in ("freeze_gc_heap()", "enable_gpu_sync_check()", "_maybe_activate_jit_monitor()"):
        assert name in body, name  # read as text: importing the worker needs CUDA


def test_each_capture_warm_up_is_metered_and_the_capture_itself_left_alone():
    """capture_warm_ups_metered wraps CudaGraphManager.capture's create_forward_fn: the warm-up
    function (warmup=True) is metered from before it is made (its inputs and attention metadata
    count) through its run with graphs off; the capture's own function (warmup=False) is the
    original, untouched (nothing may synchronise inside a capture)."""
    NONE, PIECEWISE, FULL = "NONE", "PIECEWISE", "FULL"

    class Cuda:  # the allocator's counters, driven by the fake forward functions
        def __init__(self):
            self.now, self.peak, self.syncs = 100, 100, 0

        def synchronize(self):
            self.syncs += 1

        def memory_allocated(self):
            return self.now

        def max_memory_allocated(self):
            return self.peak

        def reset_peak_memory_stats(self):
            self.peak = self.now

        def alloc(self, n):
            self.now += n
            self.peak = max(self.peak, self.now)

    cuda = Cuda()

    class Manager:  # vLLM's base class: warm up with graphs off, then capture
        max_num_reqs = 1024

        def capture(self, create_forward_fn, desc_text="Capturing"):
            for desc in self.descs:
                fn = create_forward_fn(desc, warmup=True)
                fn(NONE)
                if desc.mode == PIECEWISE:
                    fn(PIECEWISE)
                else:
                    create_forward_fn(desc, warmup=False)(NONE)

    class ModelManager(Manager):
        def capture(self, *a, **kw):
            return super().capture(*a, **kw)

    made = []

    def create_forward_fn(desc, warmup):
        cuda.alloc(desc.metadata)  # inputs and attention metadata, before the run
        made.append((desc.num_tokens, warmup))

        def fn(mode):
            cuda.alloc(desc.transient)
            cuda.alloc(-desc.transient - desc.metadata)
        fn.warmup = warmup
        return fn

    mgr = ModelManager()
    mgr.descs = [SimpleNamespace(num_tokens=4608, num_reqs=None, mode=PIECEWISE, metadata=7,
                                 transient=50),
                 SimpleNamespace(num_tokens=4608, num_reqs=512, mode=FULL, metadata=3,
                                 transient=20)]
    measure = warmup.GraphMeasure()
    with warmup.capture_warm_ups_metered(measure, cuda=cuda, manager_cls=Manager, mode_none=NONE):
        mgr.capture(create_forward_fn)
    assert (measure.capture_warmup_bytes, measure.capture_warmup_shape) == (57, (4608, 1024))
    assert made == [(4608, True), (4608, True), (4608, False)]  # PIECEWISE reuses its warm-up fn
    # unwrapped again afterwards
    before = cuda.syncs
    Manager.descs = mgr.descs
    Manager().capture(create_forward_fn)
    assert cuda.syncs == before


def test_a_kv_view_left_outside_the_forward_context_is_dropped_through_a_graph_wrapper():
    """After vLLM's cleanup of a profiling KV cache, _drop_kv_views resets any module still
    holding a view of it: found through get_model() where vLLM wrapped the model (a CUDA-graph
    or ubatch wrapper is not an nn.Module), and through unwrap() for the drafter's wrapper."""
    torch = __import__("pytest").importorskip("torch")

    from worstcase_profiler.adapter.runner import _drop_kv_views

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.kv_cache = torch.zeros(4)

    target, draft = torch.nn.Sequential(Layer()), torch.nn.Sequential(Layer())
    wrapper = SimpleNamespace(unwrap=lambda: draft)  # not an nn.Module
    runner = SimpleNamespace(model=SimpleNamespace(), get_model=lambda: target,
                             drafter=SimpleNamespace(model=wrapper))
    _drop_kv_views(runner)
    assert target[0].kv_cache.numel() == 0 and draft[0].kv_cache.numel() == 0
    _drop_kv_views(SimpleNamespace())  # nothing to reach: nothing done


def test_a_later_pipeline_stage_holds_the_received_tensors_through_each_sweep_step(monkeypatch):
    """Serving, a stage after the first receives the previous stage's intermediate tensors into
    new tensors every step and holds them beside the runner's buffer: pp_received holds `rows`
    of each of the buffer's keys for the step (making the buffer as vLLM's _dummy_run does where
    it is missing), and nothing on the first stage."""
    torch = __import__("pytest").importorskip("torch")
    from worstcase_profiler.adapter import runner as runner_mod

    class Buffer:
        def __init__(self, n):
            self.tensors = {"hidden_states": torch.zeros(n, 8), "residual": torch.zeros(n, 8)}

    class Model:
        def make_empty_intermediate_tensors(self, batch_size, dtype, device):
            return Buffer(batch_size)

    class Runner:
        max_num_tokens, device, intermediate_tensors, model = 64, "cpu", None, Model()
        model_config = type("C", (), {"dtype": torch.float32})()

    seen = []
    real_clone = torch.Tensor.clone

    def clone(self, *a, **k):
        seen.append(tuple(self.shape))
        return real_clone(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "clone", clone)
    r = Runner()
    monkeypatch.setattr(runner_mod, "_later_pp_stage", lambda: False)
    with runner_mod.pp_received(r, 16):
        pass
    assert seen == [] and r.intermediate_tensors is None
    monkeypatch.setattr(runner_mod, "_later_pp_stage", lambda: True)
    with runner_mod.pp_received(r, 16):
        assert seen == [(16, 8), (16, 8)]
    assert isinstance(r.intermediate_tensors, Buffer)
