"""The warm-up rehearsal's batch (adapter/warmup.rehearse, full_warm_up_batch): vLLM's V2 warm-up
runs as many requests as the KV cache's blocks hold, so on the provisional cache it ran 23 where
the real warm-up ran 831 and kept 2.3 GiB more (H200 run 19). Where vLLM can send every write to
the null block, the rehearsal sets that and measures the full batch. A stand-in runner whose
warm-up follows vLLM 0.32's cap (v1/worker/gpu/warmup.py) stands for vLLM."""

from __future__ import annotations

from types import SimpleNamespace

from worstcase_profiler.adapter import warmup

PER_REQUEST = 3 << 20  # what the stand-in warm-up keeps per request it ran


class Tables:  # vLLM 0.32's BlockTables: a class default the elastic-EP warm-up overrides
    redirect_writes_to_null_block = False


class OldTables:  # vLLM 0.26: no redirect
    pass


def _rehearse(tables, *, blocks=165, blocks_per_request=7, max_num_seqs=1024):
    runner = SimpleNamespace(block_tables=tables)
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
    runner = SimpleNamespace(block_tables=Tables())

    def failing():
        assert runner.block_tables.redirect_writes_to_null_block is True
        raise RuntimeError("warm-up failed")

    try:
        warmup.rehearse(SimpleNamespace(model_runner=runner), failing, lambda: 0, graphs=False)
    except RuntimeError:
        pass
    assert "redirect_writes_to_null_block" not in vars(runner.block_tables)


def test_a_speculative_runner_keeps_the_capped_batch():
    runner = SimpleNamespace(block_tables=Tables(), speculator=object())
    held = [0]

    def warm_up():
        held[0] += (1024 if runner.block_tables.redirect_writes_to_null_block else 23) * PER_REQUEST

    out = warmup.rehearse(SimpleNamespace(model_runner=runner), warm_up, lambda: held[0],
                          graphs=False)
    assert out.kept_bytes == 23 * PER_REQUEST


def test_the_rehearsal_leaves_vllms_serving_checks_to_the_real_warm_up():
    import sys
    import types

    calls = []
    module = types.ModuleType("fake_gpu_worker")
    module.enable_gpu_sync_check = lambda: calls.append("sync")

    class Worker:
        def _maybe_activate_jit_monitor(self):
            calls.append("jit")

        def compile_or_warm_up_model(self):
            self._maybe_activate_jit_monitor()
            module.enable_gpu_sync_check()

    Worker.__module__ = Worker.compile_or_warm_up_model.__module__ = module.__name__
    sys.modules[module.__name__] = module
    try:
        worker = Worker()
        worker.model_runner = SimpleNamespace(block_tables=OldTables())
        warmup.rehearse(worker, worker.compile_or_warm_up_model, lambda: 0, graphs=False)
        assert calls == []
        worker.compile_or_warm_up_model()  # the real warm-up, afterwards
        assert calls == ["jit", "sync"]
        assert "_maybe_activate_jit_monitor" not in vars(worker)
    finally:
        del sys.modules[module.__name__]
