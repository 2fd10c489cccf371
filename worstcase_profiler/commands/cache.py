"""`wcprof cache`: move sweep-cache entries between hosts.

  wcprof cache list                 the entries of this host's cache (key, model, vLLM, device)
  wcprof cache export DIR           copy every entry into DIR (a shared or shipped directory)
  wcprof cache import DIR           copy DIR's entries into this host's cache

Entries are keyed by what decides the figures (model config, limits, vLLM, torch, CUDA, kernels,
device model), never by host, so an entry made on one GPU is found on another of that model.
An imported entry is not trusted blindly: the engine replays its worst step, and the plan's
heaviest shapes unless the entry is signed, before reusing it (the sweep runs again otherwise);
with $WCPROF_CACHE_SECRET set only entries signed with that secret are read at all
(docs/cache.md). Import keeps only entries that parse (and verify, with a secret); a bad file is
named and skipped.
"""

from __future__ import annotations

from pathlib import Path

from ..core.cache import CacheEntry, SweepCache, cache_dir
from ..errors import ArgParser, ConfigError


def _local() -> SweepCache:
    directory = cache_dir(None)
    if directory is None:
        raise ConfigError("the sweep cache is off (WCPROF_CACHE_DIR=off)",
                          hint="set WCPROF_CACHE_DIR to a directory")
    return SweepCache.with_env_secret(directory)


def _entries(directory: Path, secret: str | None) -> tuple[list[tuple[Path, CacheEntry]], list[str]]:
    """The entries in `directory` this host would load (SweepCache.inspect), and why the others
    are skipped."""
    reader = SweepCache(directory, secret=secret)
    good, bad = [], []
    for path in sorted(directory.glob("*.json")):
        entry, why = reader.inspect(path)
        if entry is None:
            bad.append(f"{path.name}: {why}")
        else:
            good.append((path, entry))
    return good, bad


def parser() -> ArgParser:
    """`wcprof cache`'s verbs and their arguments."""
    p = ArgParser(prog="wcprof cache", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="verb", required=True)
    sub.add_parser("list", help="the entries of this host's cache ($WCPROF_CACHE_DIR)")
    helps = {"export": ("copy this host's entries into DIRECTORY as written (with "
                        "$WCPROF_CACHE_SECRET set, only those signed with it)",
                        "where to write them"),
             "import": ("copy DIRECTORY's entries into this host's cache (with "
                        "$WCPROF_CACHE_SECRET set, only those signed with it): the next start "
                        "of that configuration replays the entry's worst step instead of "
                        "sweeping, and re-checks its heaviest shapes unless it is signed",
                        "a directory `wcprof cache export` wrote")}
    for verb, (text, arg) in helps.items():
        sub.add_parser(verb, help=text, description=text).add_argument("directory", type=Path,
                                                                       help=arg)
    return p


def run(argv: list[str]) -> int:
    ns = parser().parse_args(argv)
    local = _local()
    secret = local.secret
    if ns.verb == "list":
        good, bad = _entries(local.directory, secret) if local.directory.exists() else ([], [])
        for path, e in good:
            cfg = e.facts.get("config", {})
            print(f"{e.key}  {e.facts.get('model_class', '?')}  vLLM {e.facts.get('vllm', '?')}  "
                  f"{e.facts.get('device', {}).get('name', '?')}  max_model_len "
                  f"{cfg.get('max_model_len', '?')}  max_num_batched_tokens "
                  f"{cfg.get('max_num_batched_tokens', '?')}  max_num_seqs "
                  f"{cfg.get('max_num_seqs', '?')}  {e.created_at}")
        for line in bad:
            print(f"skipped {line}")
        return 0
    src, dst = (local.directory, ns.directory) if ns.verb == "export" else (ns.directory, local.directory)
    if not src.is_dir():
        raise ConfigError(f"{src} is not a directory", hint="name the directory holding the entries")
    good, bad = _entries(src, secret)
    if bad and not good:  # nothing moved, and not for lack of entries: say why, fail
        raise ConfigError(
            f"no entry {ns.verb}ed from {src}: {len(bad)} file(s) skipped, e.g. {bad[0]}",
            hint="with $WCPROF_CACHE_SECRET set only entries signed with that secret are read; "
                 "`wcprof cache list` shows what this host's cache holds")
    dst.mkdir(parents=True, exist_ok=True)
    from ..atomic_write import write_atomically

    mode = 0o600 if ns.verb == "import" else None  # into a cache: as the cache writes its own
    for path, _ in good:  # as written (its signature included), never half a file
        write_atomically(dst / path.name, path.read_bytes(), mode=mode)
    print(f"{ns.verb}ed {len(good)} entr{'y' if len(good) == 1 else 'ies'} from {src} to {dst}")
    for line in bad:
        print(f"skipped {line}")
    return 0
