"""bench/gguf_layout.py: the GGUF a llama.cpp comparison loads (docs/fit.md) holds the layout's
every tensor, aligned, within the file, as a hole (no disk), with the keys llama.cpp reads."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import gguf_layout  # noqa: E402

LAYOUT = ROOT / "tests" / "gpu" / "models" / "llama-3.1-8b-layout" / "config.json"


def _read(path: Path):
    """(metadata, [(name, shape, type, offset)], data start): a GGUF v3 reader of the value
    types the writer uses."""
    b = path.open("rb").read(8 << 20)
    assert b[:4] == b"GGUF"
    version, n_t, n_kv = struct.unpack_from("<IQQ", b, 4)
    assert version == 3
    pos = 24

    def string():
        nonlocal pos
        (n,) = struct.unpack_from("<Q", b, pos)
        pos += 8 + n
        return b[pos - n:pos].decode()

    meta = {}
    for _ in range(n_kv):
        key = string()
        (vt,) = struct.unpack_from("<I", b, pos)
        pos += 4
        if vt == gguf_layout.STRING:
            meta[key] = string()
        elif vt == gguf_layout.ARRAY:
            et, n = struct.unpack_from("<IQ", b, pos)
            pos += 12
            if et == gguf_layout.STRING:
                meta[key] = [string() for _ in range(n)]
            else:
                meta[key] = list(struct.unpack_from(f"<{n}{'f' if et == 6 else 'i'}", b, pos))
                pos += 4 * n
        else:
            meta[key] = struct.unpack_from("<f" if vt == gguf_layout.FLOAT32 else "<I", b, pos)[0]
            pos += 4
    out = []
    for _ in range(n_t):
        name = string()
        (nd,) = struct.unpack_from("<I", b, pos)
        shape = struct.unpack_from(f"<{nd}Q", b, pos + 4)
        gtype, off = struct.unpack_from("<IQ", b, pos + 4 + 8 * nd)
        pos += 4 + 8 * nd + 12
        out.append((name, shape, gtype, off))
    return meta, out, pos + (-pos % 32)


def test_the_8b_layout_is_written_whole_as_a_hole_with_llamas_keys(tmp_path):
    config = json.loads(LAYOUT.read_text())
    path = tmp_path / "l.gguf"
    n = gguf_layout.write(config, path)
    meta, infos, start = _read(path)
    assert meta["general.architecture"] == "llama" and meta["llama.block_count"] == 32
    assert meta["llama.attention.head_count_kv"] == 8 and meta["llama.context_length"] == 131072
    assert meta["tokenizer.ggml.model"] == "llama" and meta["llama.vocab_size"] == 128256
    tokens = meta["tokenizer.ggml.tokens"]
    assert len(tokens) == len(meta["tokenizer.ggml.scores"]) == 128256 == len(set(tokens))
    assert tokens[3 + 10] == "<0x0A>" and meta["tokenizer.ggml.token_type"][13] == 6  # newline
    assert len(infos) == 2 + 32 * 9 + 1
    size = path.stat().st_size
    assert size == start + n
    ends = []
    for name, shape, gtype, off in infos:
        assert off % 32 == 0, name
        count = 1
        for d in shape:
            count *= d
        ends.append(start + off + count * (4 if gtype == gguf_layout.F32 else 2))
    assert max(ends) <= size and max(ends) > size - 32
    # Llama-3.1-8B: 8,030,261,248 parameters, the 65 norms of 4,096 in F32 (2 bytes more each)
    assert n == 8_030_261_248 * 2 + 65 * 4096 * 2
    assert path.stat().st_blocks * 512 < 8 << 20  # a hole: no disk for the weights
    assert not list(tmp_path.glob("*.part"))
