"""interrupts.py: Ctrl-C inside exit_at_once leaves at once, cleaned up, one line; an
uninterrupted section finishes first; outside it, or where SIGINT is ignored, nothing changes.
Each case runs in its own interpreter and signals itself."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

PRELUDE = """
import os, signal, sys, time
from worstcase_profiler import interrupts as i
def kill(): os.kill(os.getpid(), signal.SIGINT); time.sleep(1)
"""


def _run(body: str, *, ignore_sigint: bool = False) -> subprocess.CompletedProcess:
    def preexec():
        signal.signal(signal.SIGINT, signal.SIG_IGN if ignore_sigint else signal.SIG_DFL)

    return subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body)],
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
