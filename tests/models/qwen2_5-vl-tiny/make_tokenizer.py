"""Writes tokenizer.json for this tiny Qwen2.5-VL layout (committed; rerun to regenerate it):
a byte-level BPE of 400 tokens built with the `tokenizers` library, holding Qwen2-VL's special
tokens (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, the object/box/quad tags,
`<|vision_start|>`, `<|vision_end|>`, `<|vision_pad|>`, `<|image_pad|>` (id 12, config.json's
image_token_id), `<|video_pad|>`). No download: the merges are learnt from one line of text.
Usage: python make_tokenizer.py [directory]"""

from __future__ import annotations

import sys
from pathlib import Path

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
           "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
           "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
           "<|video_pad|>"]


def build(out: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["system\nYou are a helpful assistant.\nuser\nDescribe the image.\n"
                             "assistant\nA red square on a white background."] * 4, trainer)
    assert [tok.token_to_id(t) for t in SPECIAL] == list(range(len(SPECIAL)))
    tok.save(str(out / "tokenizer.json"))
    return tok.get_vocab_size()


if __name__ == "__main__":
    print(build(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent))
