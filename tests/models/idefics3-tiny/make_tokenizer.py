"""Writes tokenizer.json for this tiny Idefics3 layout (committed; rerun to regenerate it):
a byte-level BPE of 352 tokens built with the `tokenizers` library, holding the special tokens
Idefics3Processor looks up (`<image>` is id 4, config.json's image_token_id; `<fake_token_around_image>`,
`<global-img>`, the 36 `<row_i_col_j>` tile tags, `<end_of_utterance>`). No download: the merges
are learnt from one line of text. Usage: python make_tokenizer.py [directory]"""

from __future__ import annotations

import sys
from pathlib import Path

SPECIAL = (["<|begin_of_text|>", "<|end_of_text|>", "<end_of_utterance>",
            "<fake_token_around_image>", "<image>", "<global-img>"]
           + [f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)])


def build(out: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=384, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["User: Describe the image.\nAssistant: A red square on a white "
                             "background."] * 4, trainer)
    assert tok.token_to_id("<image>") == 4
    tok.save(str(out / "tokenizer.json"))
    return tok.get_vocab_size()


if __name__ == "__main__":
    print(build(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent))
