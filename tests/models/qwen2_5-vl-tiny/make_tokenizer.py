"""Writes tokenizer.json for this tiny Qwen2.5-VL layout (committed; rerun to regenerate it):
a byte-level BPE of 400 tokens built with the `tokenizers` library, holding Qwen2-VL's special
tokens (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, the object/box/quad tags,
`<|vision_start|>`, `<|vision_end|>`, `<|vision_pad|>`, `<|image_pad|>` (id 12, config.json's
image_token_id), `<|video_pad|>`). No download: the merges are learnt from one line of text.
With --special-base N the special tokens take ids N, N+1, ... (the real Qwen2-VL ids: 151643 for
`<|endoftext|>` ... 151655 for `<|image_pad|>`) and the learnt tokens ids 0, 1, ... below them
(tests/gpu/models/qwen2.5-vl-32b-layout: a large vocabulary whose ids in between stay unused).
Usage: python make_tokenizer.py [directory] [--special-base N]"""

from __future__ import annotations

import sys
from pathlib import Path

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
           "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
           "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
           "<|video_pad|>"]


def build(out: Path, special_base: int = 0) -> int:
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["system\nYou are a helpful assistant.\nuser\nDescribe the image.\n"
                             "assistant\nA red square on a white background."] * 4, trainer)
    assert [tok.token_to_id(t) for t in SPECIAL] == list(range(len(SPECIAL)))
    if special_base:  # the specials at special_base.., the learnt tokens at 0.. (merges are strings)
        n = len(SPECIAL)
        data = json.loads(tok.to_str())
        data["model"]["vocab"] = {t: (special_base + i if i < n else i - n)
                                  for t, i in data["model"]["vocab"].items()}
        for t in data["added_tokens"]:
            t["id"] += special_base
        tok = Tokenizer.from_str(json.dumps(data))
        assert [tok.token_to_id(t) for t in SPECIAL] == list(range(special_base, special_base + n))
    tok.save(str(out / "tokenizer.json"))
    return tok.get_vocab_size()


if __name__ == "__main__":
    args = sys.argv[1:]
    base = int(args.pop(args.index("--special-base") + 1)) if "--special-base" in args else 0
    args = [a for a in args if a != "--special-base"]
    print(build(Path(args[0]) if args else Path(__file__).parent, base))
