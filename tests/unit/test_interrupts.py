"""interrupts.py: Ctrl-C inside exit_at_once leaves at once, cleaned up, one line; an
uninterrupted section finishes first; outside it, or where SIGINT is ignored, nothing changes.
Each case runs in its own interpreter and signals itself."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

PRELUDE = """
import os, signal, sys, time
from pathlib import Path
from worstcase_profiler import interrupts as i
def kill(): os.kill(os.getpid(), signal.SIGINT); time.sleep(1)
"""


def _run(body: str, *, ignore_sigint: bool = False, setup: str = "") -> subprocess.CompletedProcess:
    def preexec():
        signal.signal(signal.SIGINT, signal.SIG_IGN if ignore_sigint else signal.SIG_DFL)

    return subprocess.run([sys.executable, "-c", PRELUDE + setup + textwrap.dedent(body)],
                          capture_output=True, text=True, timeout=60, preexec_fn=preexec)


def test_sigint_runs_the_cleanups_last_first_writes_one_line_and_exits_with_the_code():
    p = _run("""
        with i.exit_at_once("tool: interrupted", 130):
            with i.on_exit(lambda: print("outer", flush=True)):
                with i.on_exit(lambda: print("inner", flush=True)):
                    kill()
                    print("not reached", flush=True)
    """)
    assert p.returncode == 130
    assert p.stdout.split() == ["inner", "outer"]
    assert p.stderr == "tool: interrupted\n"


def test_a_cleanup_that_fails_does_not_stop_the_others_or_the_exit():
    p = _run("""
        with i.exit_at_once("x", 7):
            with i.on_exit(lambda: print("ran", flush=True)):
                with i.on_exit(lambda: 1 / 0):
                    kill()
    """)
    assert (p.returncode, p.stdout.strip(), p.stderr) == (7, "ran", "x\n")


def test_an_uninterrupted_section_finishes_before_the_exit():
    p = _run("""
        with i.exit_at_once("x", 130):
            with i.uninterrupted():
                kill()
                print("section finished", flush=True)
            print("after the section: not reached", flush=True)
    """)
    assert (p.returncode, p.stdout.strip()) == (130, "section finished")


def test_a_cleanup_registered_by_a_finished_block_no_longer_runs():
    p = _run("""
        with i.exit_at_once("x", 130):
            with i.on_exit(lambda: print("stale", flush=True)):
                pass
            kill()
    """)
    assert (p.returncode, p.stdout) == (130, "")


def test_outside_exit_at_once_sigint_is_pythons_keyboardinterrupt_again():
    p = _run("""
        with i.exit_at_once("x", 130):
            pass
        try:
            with i.uninterrupted():
                kill()
        except KeyboardInterrupt:
            print("KeyboardInterrupt", flush=True)
    """)
    assert (p.returncode, p.stdout.strip()) == (0, "KeyboardInterrupt")


def test_where_sigint_is_ignored_it_stays_ignored():
    """A run started in the background (nohup, `&`) must not become interruptible."""
    p = _run("""
        with i.exit_at_once("x", 130):
            kill()
            print("still running", flush=True)
    """, ignore_sigint=True)
    assert (p.returncode, p.stdout.strip()) == (0, "still running")


def test_a_second_ctrl_c_inside_a_section_leaves_at_once():
    """An exit waiting for a section that hangs (a stale network mount) is not stuck there."""
    p = _run("""
        with i.exit_at_once("x", 130):
            with i.uninterrupted():
                os.kill(os.getpid(), signal.SIGINT)
                print("first deferred", flush=True)
                kill()
                print("not reached", flush=True)
    """)
    assert (p.returncode, p.stdout.strip()) == (130, "first deferred")


def test_buffered_output_is_flushed_before_the_exit(monkeypatch):
    """A verdict printed to a pipe without a flush still arrives."""
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    p = _run("""
        with i.exit_at_once("x", 130):
            sys.stdout.write("the verdict\\n")
            kill()
    """)
    assert (p.returncode, p.stdout) == (130, "the verdict\n")


def test_the_processes_it_started_are_gone_before_the_cleanups_run():
    """vLLM's engine core and workers would otherwise go on loading or sweeping (and write into
    the temporary directory after it was removed)."""
    p = _run("""
        import multiprocessing, subprocess
        def child(): time.sleep(60)
        with i.exit_at_once("x", 130):
            kids = [subprocess.Popen(["sleep", "60"]).pid]
            mp = multiprocessing.get_context("fork").Process(target=child); mp.start()
            kids.append(mp.pid)
            def check():
                import psutil
                alive = [k for k in kids if psutil.pid_exists(k)
                         and psutil.Process(k).status() != psutil.STATUS_ZOMBIE]
                print("alive at cleanup:", alive, flush=True)
            with i.on_exit(check):
                kill()
    """)
    assert (p.returncode, p.stdout.strip()) == (130, "alive at cleanup: []"), p.stderr


def test_a_forked_child_gets_pythons_keyboardinterrupt_not_the_parents_cleanups():
    p = _run("""
        with i.exit_at_once("x", 130):
            with i.on_exit(lambda: print("cleanup in", os.getpid(), flush=True)):
                pid = os.fork()
                if pid == 0:
                    try:
                        kill()
                    except KeyboardInterrupt:
                        print("child: KeyboardInterrupt", flush=True)
                    os._exit(0)
                os.waitpid(pid, 0)
                print("parent goes on", flush=True)
    """)
    assert (p.returncode, p.stdout.splitlines()) == (
        0, ["child: KeyboardInterrupt", "parent goes on"]), p.stderr


def test_the_temporary_directory_goes_on_every_exit(tmp_path):
    p = _run(f"""
        import tempfile; tempfile.tempdir = {str(tmp_path)!r}
        with i.temporary_directory("t-") as d:
            (d / "f").write_text("x")
        print(d.exists(), flush=True)
        with i.exit_at_once("x", 130):
            with i.temporary_directory("t-") as d:
                (d / "f").write_text("x")
                kill()
    """)
    assert (p.returncode, p.stdout.strip()) == (130, "False")
    assert list(tmp_path.iterdir()) == []


REPLACE_INTERRUPTED = """
real_replace = os.replace
def replace(src, dst):  # Ctrl-C between the temp file and its rename
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)
    real_replace(src, dst)
os.replace = replace
"""


def test_an_atomic_write_finishes_before_the_exit(tmp_path):
    p = _run(f"""
        from worstcase_profiler.atomic_write import write_atomically
        with i.exit_at_once("x", 130):
            write_atomically(Path({str(tmp_path / 'r.json')!r}), "complete")
            print("not reached", flush=True)
    """, setup=REPLACE_INTERRUPTED)
    assert (p.returncode, p.stdout) == (130, "")
    assert [f.name for f in tmp_path.iterdir()] == ["r.json"]
    assert (tmp_path / "r.json").read_text() == "complete"


def test_a_sweep_cache_store_finishes_before_the_exit(tmp_path):
    tests_unit = str(Path(__file__).parent)
    p = _run(f"""
        sys.path.insert(0, {tests_unit!r})
        from test_cache import _entry, _sweep
        from worstcase_profiler.core.cache import SweepCache
        cache = SweepCache(Path({str(tmp_path)!r}))
        with i.exit_at_once("x", 130):
            cache.store(_entry(_sweep(), "k"))
            print("not reached", flush=True)
    """, setup=REPLACE_INTERRUPTED)
    assert p.returncode == 130, p.stderr
    assert [f.name for f in tmp_path.iterdir()] == ["k.json"]
    from worstcase_profiler.core.cache import SweepCache

    assert SweepCache(tmp_path).load("k") is not None
