"""A GGUF file of a Llama-layout model's shapes with zero weights, written from its HF config.json,
so that llama.cpp can plan and load the same layout the GPU suite runs in vLLM with dummy weights
(docs/fit.md, "Beside llama.cpp's `--fit`"). Pure Python, no numpy: the tensor data is a hole
at the end of a sparse file (zeros when read), so a 16 GB layout takes no disk and is written in
milliseconds.

  python3 bench/gguf_layout.py tests/gpu/models/llama-3.1-8b-layout /tmp/llama8b-f16.gguf

Weights are F16 (the norms F32, as llama.cpp's converter writes them). The vocabulary is a
SentencePiece-type one of the config's vocab_size dummy pieces (unknown, BOS, EOS, the 256 byte
pieces, then one piece per id): a tokenizer plays no part in the memory plan, but llama-server
turns every sampled token into text, which llama.cpp's "no_vocab" refuses. Contract:
`write(config, path)` writes GGUF v3 with the llama.* keys llama.cpp reads for a
LlamaForCausalLM and returns the tensor bytes; only that architecture is taken."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

ALIGN = 32  # GGUF's default alignment of every tensor's data
F32, F16 = 0, 1  # ggml types
UINT32, INT32, FLOAT32, STRING, ARRAY = 4, 5, 6, 8, 9  # GGUF value types
NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6  # llama.cpp's token types


def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def _kv(key: str, value) -> bytes:
    if isinstance(value, tuple):  # (element type, values): an array
        kind, items = value
        head = _str(key) + struct.pack("<IIQ", ARRAY, kind, len(items))
        if kind == STRING:
            return head + b"".join(_str(x) for x in items)
        return head + struct.pack(f"<{len(items)}{'f' if kind == FLOAT32 else 'i'}", *items)
    if isinstance(value, str):
        return _str(key) + struct.pack("<I", STRING) + _str(value)
    if isinstance(value, float):
        return _str(key) + struct.pack("<If", FLOAT32, value)
    return _str(key) + struct.pack("<II", UINT32, int(value))


def tensors(c: dict) -> list[tuple[str, tuple[int, ...], int]]:
    """(name, ggml shape (innermost first), ggml type) of every tensor of a Llama layout."""
    h, ff, vocab = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    heads, kv = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
    hd = c.get("head_dim") or h // heads
    out = [("token_embd.weight", (h, vocab), F16)]
    for i in range(c["num_hidden_layers"]):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (h,), F32), (b + "attn_q.weight", (h, heads * hd), F16),
                (b + "attn_k.weight", (h, kv * hd), F16), (b + "attn_v.weight", (h, kv * hd), F16),
                (b + "attn_output.weight", (heads * hd, h), F16),
                (b + "ffn_norm.weight", (h,), F32), (b + "ffn_gate.weight", (h, ff), F16),
                (b + "ffn_up.weight", (h, ff), F16), (b + "ffn_down.weight", (ff, h), F16)]
    out += [("output_norm.weight", (h,), F32)]
    if not c.get("tie_word_embeddings", False):
        out += [("output.weight", (h, vocab), F16)]
    return out


def metadata(c: dict, name: str) -> dict:
    heads = c["num_attention_heads"]
    hd = c.get("head_dim") or c["hidden_size"] // heads
    return {
        "general.architecture": "llama", "general.name": name, "general.file_type": 1,
        "llama.context_length": c["max_position_embeddings"],
        "llama.embedding_length": c["hidden_size"], "llama.block_count": c["num_hidden_layers"],
        "llama.feed_forward_length": c["intermediate_size"], "llama.attention.head_count": heads,
        "llama.attention.head_count_kv": c.get("num_key_value_heads", heads),
        "llama.attention.key_length": hd, "llama.attention.value_length": hd,
        "llama.rope.dimension_count": hd, "llama.rope.freq_base": float(c.get("rope_theta", 1e4)),
        "llama.attention.layer_norm_rms_epsilon": float(c.get("rms_norm_eps", 1e-5)),
        "llama.vocab_size": c["vocab_size"], **vocabulary(c["vocab_size"]),
    }


def vocabulary(n: int) -> dict:
    """A SentencePiece-type vocabulary of `n` dummy pieces, as llama.cpp loads one."""
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [UNKNOWN, CONTROL, CONTROL] + [BYTE] * 256
    pieces += [f"\u2581t{i}" for i in range(len(pieces), n)]
    types += [NORMAL] * (n - len(types))
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": (STRING, pieces[:n]),
            "tokenizer.ggml.scores": (FLOAT32, [0.0] * n),
            "tokenizer.ggml.token_type": (INT32, types[:n]),
            "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.eos_token_id": 2}


def _pad(n: int) -> int:
    return -n % ALIGN


def write(config: dict, path: Path, name: str = "layout") -> int:
    """Write the GGUF at `path` (atomically: a temporary name, then renamed); returns the tensor
    bytes (the model's weights as llama.cpp will allocate them)."""
    if config.get("architectures", ["LlamaForCausalLM"])[0] != "LlamaForCausalLM":
        raise SystemExit(f"only LlamaForCausalLM layouts are written, not {config['architectures']}")
    meta = metadata(config, name)
    specs = tensors(config)
    head = b"GGUF" + struct.pack("<IQQ", 3, len(specs), len(meta))
    head += b"".join(_kv(k, v) for k, v in meta.items())
    offset, infos = 0, []
    for tname, shape, gtype in specs:
        infos.append(_str(tname) + struct.pack("<I", len(shape))
                     + struct.pack(f"<{len(shape)}Q", *shape) + struct.pack("<IQ", gtype, offset))
        size = (4 if gtype == F32 else 2)
        for d in shape:
            size *= d
        offset += size + _pad(size)
    head += b"".join(infos)
    head += b"\0" * _pad(len(head))
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as f:
        f.write(head)
        f.truncate(len(head) + offset)  # the data: a hole, zeros when read
    tmp.replace(path)
    return offset


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    src, dst = Path(argv[0]), Path(argv[1])
    config = json.loads((src / "config.json" if src.is_dir() else src).read_text())
    n = write(config, dst, name=src.name)
    print(json.dumps({"gguf": str(dst), "tensor_bytes": n, "file_bytes": dst.stat().st_size}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
