"""Ctrl-C while torch and vLLM run: stop cleaned up, never raising half-way through C++.

Python turns SIGINT into a KeyboardInterrupt raised at the next bytecode, wherever that is. Inside
torch's import and vLLM's engine start that is often code called back from C++, which does not
expect it: torch's `_C` swallows one that lands in its numpy import (the run went on to exit 0),
and one that lands under a C++ frame ends in std::terminate (exit -6, seen in CI). So while
`exit_at_once()` is active, SIGINT does not raise. It flushes Python's buffered output, kills
this process's descendants (vLLM's engine core and workers, which would otherwise finish loading
or sweeping, holding device memory, before they notice), runs the registered cleanups (last
registered first), writes one line to stderr and leaves with `os._exit`.

When it acts: as soon as the main thread runs Python again (a kernel, a weight load or a graph
capture in C++ finishes first), except inside an `uninterrupted()` section (a file written then
renamed into place), which finishes first; a second Ctrl-C there leaves at once. A forked child
that inherited the handler gets Python's KeyboardInterrupt, not the parent's cleanups. Outside
`exit_at_once()` nothing changes. Process state, standard library only (psutil when present)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

_cleanups: list[Callable[[], None]] = []
_exit: tuple[str, int, int] | None = None  # (line, code, pid) while exit_at_once is active
_lock = threading.Lock()
_depth = 0  # uninterrupted() sections open, in any thread
_pending = False  # a SIGINT arrived inside one of them
_leaving = False


def _flush() -> None:
    for stream in {id(s): s for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
                   if s is not None}.values():
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a write the signal interrupted, a closed stream
            pass


def _kill_descendants() -> None:
    """SIGKILL every process this one started, and wait (5 s at most) until they are gone, so
    that none writes into a directory a cleanup is about to remove."""
    try:
        import psutil
    except ImportError:
        import multiprocessing  # here, not at the top: every wcprof start, --help too, imports us

        for child in multiprocessing.active_children():
            child.kill()
            child.join(5)
        return
    try:
        kids = psutil.Process().children(recursive=True)
    except psutil.Error:
        return
    for kid in kids:
        with contextlib.suppress(psutil.Error):
            kid.kill()
    psutil.wait_procs(kids, timeout=5)


def _leave() -> None:
    global _leaving
    if _leaving or _exit is None:
        return
    _leaving = True
    line, code, _ = _exit
    _flush()
    for step in (_kill_descendants, *reversed(_cleanups)):
        try:
            step()
        except BaseException:  # noqa: BLE001 - leaving anyway; one step must not stop the rest
            pass
    prefix = "\r\033[K\033[?25h" if os.isatty(2) else ""  # a spinner's line and hidden cursor
    try:
        os.write(2, f"{prefix}{line}\n".encode())
    except OSError:
        pass
    os._exit(code)


def _on_sigint(_signum, _frame) -> None:
    global _pending
    if _exit is None or os.getpid() != _exit[2]:
        raise KeyboardInterrupt  # a forked child, or exit_at_once already over
    if _depth and not _pending:
        _pending = True
        if _depth:  # else the section ended meanwhile (another thread) and may have missed it
            return
    _leave()  # outside a section, or a second Ctrl-C while one is pending


@contextlib.contextmanager
def exit_at_once(line: str, code: int) -> Iterator[None]:
    """While active, SIGINT runs the cleanups, writes `line` and exits with `code`. It replaces
    only Python's own KeyboardInterrupt handler, in the main thread: where SIGINT is ignored (a
    run started with nohup or `&`) or already handled, nothing changes."""
    global _exit, _pending
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    _exit = (line, code, os.getpid())
    signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _exit = None
        if _pending:  # asked for inside a section that outlives this block: Python's way now
            _pending = False
            raise KeyboardInterrupt


@contextlib.contextmanager
def on_exit(cleanup: Callable[[], None]) -> Iterator[None]:
    """Run `cleanup` if an interrupt exits while this block is open (it runs before the ones
    registered outside it)."""
    _cleanups.append(cleanup)
    try:
        yield
    finally:
        _cleanups.remove(cleanup)


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """A section an interrupt may not cut in half: an exit asked for inside it (in any thread's
    section) happens when the last open section ends."""
    global _depth, _pending
    with _lock:
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            leave = not _depth and _pending and _exit is not None
            if leave:
                _pending = False
        if leave:
            _leave()


@contextlib.contextmanager
def temporary_directory(prefix: str) -> Iterator[Path]:
    """tempfile's temporary directory, removed on every exit, this module's included: made and
    registered, then removed and unregistered, each in one uninterrupted step."""
    with uninterrupted():
        path = tempfile.mkdtemp(prefix=prefix)

        def remove() -> None:
            shutil.rmtree(path, ignore_errors=True)

        _cleanups.append(remove)
    try:
        yield Path(path)
    finally:
        with uninterrupted():
            remove()
            _cleanups.remove(remove)
