"""Sweep results kept across engine starts, so that a restart does not pay the sweep again.

The sweep's outcome depends on the model, the engine limits, the kernels (vLLM, torch, CUDA,
attention backend, runner) and the device; `cache_key` hashes all of them. A hit is not trusted
blindly: the engine replays the cached worst step on its provisional KV cache and compares what
it needs now with what it needed when the entry was written (cache_trust.cache_verdict). Needing
more than the meter's tolerance allows means something the key did not see changed (a driver, a
model plugin's code); the entry is then discarded and the full sweep runs, never a silent reuse
of a stale figure.

Entries are JSON files named by the key, written atomically, in their own versioned layout
(`CacheEntry`, SCHEMA): renaming a report field changes neither keys nor entries. A corrupt,
foreign or older entry reads as a miss. The directory: the `cache_dir` setting, else
$WCPROF_CACHE_DIR, else $XDG_CACHE_HOME/worstcase_profiler (~/.cache/worstcase_profiler). `off`
disables the cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import os
import secrets
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..atomic_write import write_atomically
from .codec import decode, encode
from .types import CutDownProof, StepResult, SweepResult, WarmupEstimate

ENV_DIR = "WCPROF_CACHE_DIR"
ENV_SECRET = "WCPROF_CACHE_SECRET"
HOST_KEY = ".host-key"
"""This host's own signing key, in the cache directory (no .json: never listed, exported or
imported as an entry)."""
OFF = "off"
SCHEMA = 14
"""Raised whenever this build's sweep plans a step an older build's never measured (6: the
mixed pair, shapes.mixed_pair; 7: the context ladder's rungs past powers of two, and extents
that no longer scale a recurrent state down; 8: a compiled forward's cut-down sweep reads its
full-model steps eagerly too and splits each difference, sweep_depth.depth_difference), reads
a step differently (9: a step that leaves memory live is measured again, core/readings) or
admits differently for the same facts (10: a Mamba group's running-state block counted in every
request without a drafter too, adapter/kv.state_blocks, so a hybrid plans fewer requests), or
writes an entry an older build cannot read (11: host_mac, which an older build's decoder and
fleet MAC do not know, so builds sharing a directory would overwrite each other; 12:
pool_fit_steps and pool_fit_held_bytes, the same way; 13: the proof's seconds_split; 14:
pool_fit_pool_tokens): an older
entry is then a miss, never a worst case that skipped a step real traffic forms. What each
value changed is in the commit that raised it."""


def cache_dir(setting: str | None, environ: dict[str, str] | None = None) -> Path | None:
    """Where entries live, or None when the cache is off."""
    env = os.environ if environ is None else environ
    chosen = setting or env.get(ENV_DIR)
    if chosen is None:
        base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        chosen = os.path.join(base, "worstcase_profiler")
    return None if chosen.strip().lower() == OFF else Path(chosen)


def cache_key(facts: dict[str, Any]) -> str:
    """24 hex chars of sha256 over the canonical JSON of everything the sweep depends on."""
    canonical = json.dumps({"schema": SCHEMA, **facts}, sort_keys=True, separators=(",", ":"),
                           default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:24]


def _quantum(tokens: int) -> int:
    """round_capacity_up's step at `tokens`."""
    return 1 << max(0, tokens.bit_length() - 5)


def within_one_step(tokens: int, of: int) -> bool:
    """Whether a pool of `tokens` lies at most one rounding step (round_capacity_up's, at the
    smaller of the two) below or at `of`, or above it."""
    return tokens >= of - _quantum(min(tokens, of))


def round_capacity_up(tokens: int) -> int:
    """KV capacity to 1/16 precision, rounded up: vLLM's own budget moves by a few blocks from
    one start to the next, which must not change the key. Up is the safe direction (longer
    extents are planned than the pool can hold)."""
    quantum = _quantum(tokens)
    return -(-tokens // quantum) * quantum


def pool_capacity_tokens(*, explicit_bytes: int | None, stock_kv_bytes: int,
                         graph_estimate_bytes: int, bytes_per_token: int,
                         max_model_len: int, kv_cap_bytes: int | None = None) -> int:
    """The KV pool's bound in tokens, which caps the shapes a sweep plans (recorded with its
    cache entry, not in the key: pool_reuse):
    `--kv-cache-memory-bytes` when given, else vLLM's own KV figure with its CUDA-graph estimate
    added back. vLLM subtracts that estimate from its figure; added back, the bound does not
    depend on it (first starts once made vLLM's estimate capture every graph, which raised it,
    where cached starts saw the sampled one: without it the same configuration keyed two
    entries, and existing entries keep their keys). `kv_cap_bytes` (the kv_cap setting) bounds what is
    allocated, so the pool too: where it binds (wcprof's 512 MiB on the CPU), the plan no longer
    follows vLLM's CPU figure, a share of the host's free memory. At least one request at
    max_model_len."""
    pool = explicit_bytes if explicit_bytes is not None else \
        stock_kv_bytes + max(0, graph_estimate_bytes)
    if kv_cap_bytes is not None:
        pool = min(pool, kv_cap_bytes)
    return round_capacity_up(max(max_model_len, int(pool) // bytes_per_token))


@dataclass(frozen=True)
class PoolReuse:
    """How a cached sweep's plan meets this start's KV pool (pool_reuse)."""

    usable: bool
    """The entry's plan stands for this start (else the sweep runs again)."""
    plan_tokens: int | None
    """The pool the start plans with: the entry's where usable (its shapes were measured for
    it), else this start's own."""
    hold: bool
    """This start's pool is larger than the plan's: the KV cache is held at the plan's pool."""
    why: str


def pool_reuse(entry_tokens: int | None, start_tokens: int | None, *,
               can_hold: bool = True) -> PoolReuse:
    """Whether a cached sweep planned for a KV pool of `entry_tokens` (CacheEntry.capacity_tokens)
    stands for a start whose own pool bound is `start_tokens` (pool_capacity_tokens; None: no
    bound). vLLM's figure moves between starts of one configuration (a hybrid with CUDA graphs
    read 1.06 GB less at its first start, whose profile captured every graph, than at its
    restart), and a pool near a rounding step then lands one step up or down, so an exact match
    would sweep again on a restart. Within one rounding step the entry's plan is kept:
      - a larger planned pool: every step this start's pool can form, the plan's pool can form
        too (request counts and extents only grow with the pool), so the plan bounds it; the
        admission stays within the plan's pool as within its own (budget.planned_pool);
      - a smaller planned pool: the KV cache is held at the plan's pool (`hold`,
        budget.planned_pool), so no more requests are resident at once than the plan measured;
        not where it cannot be held (`can_hold` False: an explicit KV size, which vLLM gets as
        given, or report mode, which hands vLLM its own figure), and then the sweep runs again.
    Further apart (a changed --gpu-memory-utilization, KV size or kv_cap, none of them in the
    key), or with one bound unknown, the sweep runs again for this start's own pool."""
    if entry_tokens == start_tokens:
        return PoolReuse(True, entry_tokens, False, "the same KV pool")
    if entry_tokens is None or start_tokens is None:
        return PoolReuse(False, start_tokens, False,
                         "one of the two starts has no KV pool bound, the other has")
    step = _quantum(min(entry_tokens, start_tokens))  # one step of the finer grid
    planned = (f"planned for a {'larger' if entry_tokens > start_tokens else 'smaller'} KV pool "
               f"({entry_tokens:,} tokens, this start's {start_tokens:,})")
    if abs(entry_tokens - start_tokens) > step:
        return PoolReuse(False, start_tokens, False,
                         f"{planned}, more than one rounding step ({step:,} tokens) apart")
    if entry_tokens > start_tokens:
        return PoolReuse(True, entry_tokens, False,
                         f"{planned}: its plan bounds every step this pool forms")
    if not can_hold:
        return PoolReuse(False, start_tokens, False,
                         f"{planned}, and this start's KV cache cannot be held at it (an "
                         "explicit KV size or report mode)")
    return PoolReuse(True, entry_tokens, True,
                     f"{planned}: the KV cache is held at most at the planned pool")


@dataclass(frozen=True)
class CacheEntry:
    """One configuration's sweep, as the start that wrote it measured it."""

    key: str
    facts: dict
    created_at: str
    sweep: SweepResult
    workspace_slot_bytes: int = 0
    """What every workspace slot was grown to (a replay runs one step: it grows them to this)."""
    baseline_bytes: int = 0
    """Held memory just before the sweep (after vLLM's own profile)."""
    consumed_bytes: int = 0
    """Held memory after the sweep and the workspace reservation: baseline + the sweep's residue."""
    warmup: WarmupEstimate = WarmupEstimate()
    """What warm-up kept at the start that wrote or last used the entry."""
    capacity_tokens: int | None = None
    """The KV pool (rounded up) the sweep's shapes were planned for: not in the key, so the
    entry is found before vLLM's own profile; a start with another pool keeps this plan, or
    sweeps again, as pool_reuse says."""
    sweep_mode: str = "full"
    """How the sweep ran (full, or cut down and confirmed), as the report shows it."""
    proof: CutDownProof | None = None
    """The self-check's verdict (sweep_depth=self-check, auto's on CUDA: kept the cut-down
    sweep, or fell back to the full one, with the sampled differences): signed with the entry, so a restart or another host
    reuses the verdict with the sweep and the report shows it again. None for other modes (a
    prove run's comparison is one start's, not reused) and for entries written before it."""
    pool_fit_steps: tuple[StepResult, ...] = ()
    """The full-model readings the pool fit measured at the starts that used the entry (one per
    shape, the largest; the fitted worst step's with its attributed op). A restart whose entry skips the
    dominance re-check (cache_trust.TRUST_SKIPS_RECHECK) fits with these instead of measuring
    them again, and measures only shapes missing here; a re-checked entry measures them all."""
    pool_fit_held_bytes: int = 0
    """The most the fit's steps left held at any of those starts (a restart that reads them
    counts at least this in its consumed memory, as the start that measured them did)."""
    pool_fit_pool_tokens: int | None = None
    """The pool the last start that fitted stored its plan for (PoolFit.pool_tokens): the shapes
    of that plan it could build are among pool_fit_steps, so a trusted restart whose budget
    leaves a pool up to one rounding step smaller plans for this one instead, where every shape
    of its plan is there, and measures none of them (its plan bounds every step the smaller
    pool forms; adapter/pool_fit.fit_to_pool's known_pool)."""
    schema: int = SCHEMA
    mac: str | None = None
    """HMAC-SHA256 of the entry under the operator's secret ($WCPROF_CACHE_SECRET), when one is
    set: a cache shared between hosts then only accepts entries a trusted producer wrote."""
    host_mac: str | None = None
    """HMAC-SHA256 of the entry under the key of the host that wrote it (host_key, bound to
    that machine): a start on that host knows the entry is its own, not an import or a forgery."""

    @property
    def worst_need(self) -> int:
        """What the cached worst step needed when the entry was written."""
        return self.sweep.worst.need_bytes

    def to_json(self) -> str:
        return json.dumps(encode(self), indent=1)

    def signed(self, secret: str | None, host: bytes | None = None) -> "CacheEntry":
        """This entry with the operator's MAC (under `secret`) and this host's (under `host`,
        a host_key), each None where its key is."""
        body = encode(dataclasses.replace(self, mac=None, host_mac=None))
        return dataclasses.replace(self, mac=_mac(body, secret) if secret else None,
                                   host_mac=_mac(body, host) if host else None)

    @classmethod
    def from_document(cls, data) -> "CacheEntry":
        """The entry a parsed JSON document holds; ValueError on anything but a complete entry
        of this SCHEMA."""
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ValueError("not a cache entry of schema %d" % SCHEMA)
        return decode(cls, data)

    def replace(self, **changes) -> "CacheEntry":
        return dataclasses.replace(self, **changes)


def _mac(body: dict, key: str | bytes) -> str:
    """The MAC of an entry document under `key`: over its fields with `mac` null and `host_mac`
    left out, so neither MAC covers the other and an entry written before host_mac existed
    verifies as it did."""
    fields = {k: v for k, v in body.items() if k != "host_mac"}
    canonical = json.dumps(dict(fields, mac=None), sort_keys=True, separators=(",", ":"))
    raw = key.encode() if isinstance(key, str) else key
    return hmac.new(raw, canonical.encode(), hashlib.sha256).hexdigest()


def document_trusted(data: dict, secret: str | None) -> bool:
    """With a secret, whether the entry document `data` (as stored: the JSON object) carries the
    MAC of its own fields under it; without one, True. The MAC covers what the producer wrote, not
    this version's decoding of it: an entry written before a field with a default was added still
    verifies (the reader fills that default in), and any change to a written field does not."""
    if not secret:
        return True
    mac = data.get("mac")
    return isinstance(mac, str) and hmac.compare_digest(mac, _mac(data, secret))


def written_here(data: dict, host: bytes | None) -> bool:
    """Whether the entry document `data` carries this host's MAC of its own fields (host: this
    host's host_key; None: False)."""
    mac = data.get("host_mac")
    return bool(host) and isinstance(mac, str) and hmac.compare_digest(mac, _mac(data, host))


def machine_id() -> str:
    """What tells this machine from another sharing its files: /etc/machine-id, else the host
    name."""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            found = Path(path).read_text().strip()
        except OSError:
            continue
        if found:
            return found
    return socket.gethostname()


def host_key(directory: Path) -> tuple[bytes | None, str]:
    """(this host's signing key for the cache at `directory`, "") or (None, why not). The key is
    64 hex characters (32 random bytes) in directory/.host-key, made once (whole or not at all),
    and used with machine_id: two machines sharing the directory sign differently, unless they
    share a machine id too (containers of one image that ships a fixed /etc/machine-id: they
    then trust each other's entries as nodes under one fleet secret do). None, and every entry
    re-checked as before, where another user could read the key or write the directory (an
    entry written there proves nothing about who wrote it), or where the key cannot be read or
    made, or is not one this build writes. Never raises."""
    path = directory / HOST_KEY
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)  # a new one: this user's
        if not path.exists():
            fd, tmp = tempfile.mkstemp(prefix=f"{HOST_KEY}.", suffix=".tmp", dir=directory)
            try:
                with os.fdopen(fd, "w") as f:  # mkstemp's file is 0600
                    f.write(secrets.token_hex(32))
                os.link(tmp, path)  # never a half-written key; a racing start's stands
            except FileExistsError:
                pass
            finally:
                os.unlink(tmp)
        here, key = directory.stat(), path.stat()
        uid = os.getuid()
        if here.st_uid != uid or here.st_mode & 0o022:
            return None, f"{directory} is writable by other users"
        if key.st_uid != uid or key.st_mode & 0o077:
            return None, f"{path} is readable by other users"
        text = path.read_bytes().strip()
    except OSError as e:
        return None, f"{path}: {e.strerror or e}"
    if len(text) != 64 or any(c not in b"0123456789abcdef" for c in text):
        return None, f"{path} is not a key this build writes (64 hex characters)"
    return text + b"|" + machine_id().encode(), ""


@dataclass
class SweepCache:
    directory: Path

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    secret: str | None = None
    """$WCPROF_CACHE_SECRET: entries are signed with it, and only verified ones are loaded."""
    host: bytes | None = None
    """This host's key (host_key): entries this host writes carry its MAC, and one that does is
    known to be this host's own (trust "host")."""

    @classmethod
    def with_env_secret(cls, directory: Path, environ: dict[str, str] | None = None) -> "SweepCache":
        """The cache at `directory` under the operator's $WCPROF_CACHE_SECRET (unset or empty:
        none), as every reader and writer of a shared cache must open it."""
        env = os.environ if environ is None else environ
        return cls(directory, secret=env.get(ENV_SECRET) or None)

    @classmethod
    def for_engine(cls, directory: Path, environ: dict[str, str] | None = None
                   ) -> tuple["SweepCache", str]:
        """(the cache an engine start reads and writes: with_env_secret's plus this host's key,
        why there is no host key or "")."""
        host, why = host_key(directory)
        return dataclasses.replace(cls.with_env_secret(directory, environ), host=host), why

    def load(self, key: str) -> CacheEntry | None:
        return self.inspect(self.path(key))[0]

    def load_with_trust(self, key: str) -> tuple[CacheEntry | None, str | None, bool]:
        """(the entry for `key` or None, how it is trusted beyond its replay, whether this host
        wrote it): trust "signed" (its MAC verified under $WCPROF_CACHE_SECRET), "host" (no
        secret, and this host's MAC verified), None (neither: an import, an entry of an older
        build, or a forgery); `own` whether this host's MAC verified, with a secret or not."""
        entry, _, data = self._read(self.path(key))
        if entry is None:
            return None, None, False
        own = written_here(data, self.host)
        return entry, ("signed" if self.secret else "host" if own else None), own

    def inspect(self, path: Path) -> tuple[CacheEntry | None, str | None]:
        """(the entry, None) when the file at `path` may be used, else (None, why not): not a
        complete entry of this schema, named for another key, or unsigned with a secret set."""
        entry, why, _ = self._read(path)
        return entry, why

    def _read(self, path: Path) -> tuple[CacheEntry | None, str | None, dict]:
        try:
            data = json.loads(path.read_text())
            entry = CacheEntry.from_document(data)
        except (OSError, ValueError, TypeError) as e:
            return None, f"not a cache entry ({e})", {}
        if path.stem != entry.key:
            return None, "named for another key", data
        if not document_trusted(data, self.secret):
            return None, "not signed with $WCPROF_CACHE_SECRET", data
        if "confirmed" not in data["sweep"] and entry.sweep.depth_delta > 0:
            # SweepResult.confirmed's default (0) would take its full-model steps for cut ones
            return None, "a cut-down sweep written before it recorded its confirmed steps", data
        return entry, None, data

    def store(self, entry: CacheEntry, *, as_own: bool = True) -> Path:
        """Write `entry`, signed under the secret and, where `as_own`, this host's key: an entry
        this start measured, or one it had trusted as its own (not an import re-written)."""
        entry = entry.signed(self.secret, self.host if as_own else None)
        target = self.path(entry.key)
        # 0600 as before the one helper: an entry names the host's model paths and config
        write_atomically(target, entry.to_json(), mode=0o600)  # a Ctrl-C waits for the rename
        return target
