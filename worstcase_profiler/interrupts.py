"""Ctrl-C while torch and vLLM run: exit at once, cleaned up, never half-way through C++.

Python turns SIGINT into a KeyboardInterrupt raised at the next bytecode, wherever that is. Inside
torch's import and vLLM's engine start that is often code called back from C++, which does not
expect it: torch's `_C` swallows one that lands in its numpy import (the run went on to exit 0),
and one that lands under a C++ frame ends in std::terminate (exit -6, seen in CI). So while
`exit_at_once()` is active, SIGINT does not raise: it runs the registered cleanups (last
registered first), writes one line to the terminal's stderr and leaves with `os._exit`. Child
processes need nothing here: vLLM's workers watch a pipe to their parent and exit with it.

`uninterrupted()` marks a short section that must not be cut (a file written then renamed into
place); an exit asked for inside it waits until the section ends. The module holds process state
and touches only the standard library; outside `exit_at_once()` it changes nothing."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator

_cleanups: list[Callable[[], None]] = []
_exit: tuple[str, int] | None = None  # (line, code) while exit_at_once is active
_depth = 0  # uninterrupted() sections open in the main thread
_pending = False  # a SIGINT arrived inside one of them


def _leave() -> None:
    assert _exit is not None
    line, code = _exit
    for fn in reversed(_cleanups):
        try:
            fn()
        except BaseException:  # noqa: BLE001 - leaving anyway; one cleanup must not stop the rest
            pass
    prefix = "\r\033[K\033[?25h" if os.isatty(2) else ""  # a spinner's line and hidden cursor
    try:
        os.write(2, f"{prefix}{line}\n".encode())
    except OSError:
        pass
    os._exit(code)


def _on_sigint(_signum, _frame) -> None:
    global _pending
    if _depth:
        _pending = True
        return
    _leave()


@contextlib.contextmanager
def exit_at_once(line: str, code: int) -> Iterator[None]:
    """While active, SIGINT runs the cleanups, writes `line` and exits with `code`. It replaces
    only Python's own KeyboardInterrupt handler, in the main thread: where SIGINT is ignored (a
    run started with nohup or `&`) or already handled, nothing changes."""
    global _exit
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    _exit = (line, code)
    signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _exit = None


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
    """A section an interrupt may not cut in half: an exit asked for inside it happens when it
    ends (in the main thread; other threads never receive signals)."""
    global _depth, _pending
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if not _depth and _pending:
            _pending = False
            if _exit is not None:
                _leave()
