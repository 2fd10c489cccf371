"""The package's one way to write a file atomically: a temporary file in the same directory,
fsync, os.replace. A reader sees the old file or the complete new one, never a prefix; a crash,
a full disk or a Ctrl-C leaves no half-written report, picture, summary or cache entry. Every
writer of a file another run reads back uses it: the JSON, HTML and PNG reporters, the sweep
cache (core/cache.py), `wcprof cache export/import` and `wcprof gate`.

Pure Python (no vLLM, no torch): the core may import it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import OutputError
from .interrupts import uninterrupted


def write_atomically(path: Path, data: str | bytes, *, mode: int | None = None) -> None:
    """Temp file in the same directory, fsync, os.replace: the destination is either the old
    file or the complete new one, never a prefix, and a Ctrl-C leaves no temp file behind.
    Its mode: `mode` where given (the sweep cache's entries: 0600), else the old file's, else
    what open() would give a new file (0666 less the umask)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with uninterrupted():
            _write_and_replace(path, data, mode)
    except OutputError:
        raise
    except OSError as e:  # a full disk, a read-only mount: the operator's, naming the path
        raise OutputError.writing(path, e) from e
    _fsync_dir(path.parent)


def _umask() -> int:
    old = os.umask(0o022)
    os.umask(old)
    return old


def _write_and_replace(path: Path, data: str | bytes, mode: int | None) -> None:
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    binary = isinstance(data, bytes)
    if mode is None:  # mkstemp makes the file 0600
        mode = path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~_umask()
    try:
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as tmp:
            os.fchmod(tmp.fileno(), mode)
            tmp.write(data)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable; best effort (not every platform can open a directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
