"""Writes this fixture's config.json, tokenizer.json and tokenizer_config.json (committed; rerun to
regenerate them, the output is byte-identical): the DeepSeek-V4 vision layout (issue 36) that vLLM
serves as `DeepseekV4ForConditionalGeneration`, for the H200 with `--load-format dummy`.

- config.json: ../dsv4-4l-mtp/config.json (the 4-layer text layout the suite's DSpark cases run,
  with its MTP and DSpark fields: the vision class keeps the drafters) plus the ten flat
  `vision_*` fields of DeepSeek-V4-Flash-Vision-Exp (README.md says where each comes from).
  `architectures` stays `DeepseekV4ForCausalLM`, as the real checkpoint ships it: vLLM routes a
  `deepseek_v4` config with `vision_n_layers > 0` to the vision class itself
  (transformers_utils/model_arch_config_convertor.py, DeepseekV4ModelArchConfigConvertor).
- tokenizer.json: not DeepSeek's tokenizer. A byte-level BPE of a few hundred tokens learnt from
  one line of text (no download), the learnt tokens at ids 3.., and the special tokens vLLM's
  DeepSeek-V4 code names at fixed ids: BOS 0 and EOS 1 (config.json), the five image sentinels
  `<|place_holder_mm_span_0431|>`..`_0435|>` at 129257..129261 (vLLM checks exactly these ids,
  models/deepseek_v4/common/mm_preprocess.py IMAGE_SENTINEL_BASE_ID), the image placeholder
  `<｜deepseek_image｜>`, and the chat encoding's role and thinking tokens. Ids in between are
  unused (they decode to nothing); the vocabulary size is config.json's 129,280.
- tokenizer_config.json: a TokenizersBackend config (vLLM's `deepseek_v4` tokenizer mode loads
  tokenizer.json through transformers' TokenizersBackend), model_max_length 1,048,576.

Usage: python build.py [directory]"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEXT = HERE.parent / "dsv4-4l-mtp" / "config.json"

# DeepSeek-V4-Flash-Vision-Exp's vision fields (flat, top level; README.md: sources)
VISION = {
    "vision_n_layers": 32,
    "vision_dim": 1024,
    "vision_n_heads": 16,
    "vision_inter_dim": 2816,
    "vision_patch_size": 14,
    "vision_rope_theta": 10000.0,
    "vision_downsample_ratio": 3,
    "vision_max_n_token": 384,
    "vision_min_pixels": 147456,
    "vision_max_wh_ratio": 8,
}

SENTINEL_BASE = 129257  # mm_preprocess.IMAGE_SENTINEL_BASE_ID: START, PAD, IMAGE, NEWLINE, END
IMAGE_PLACEHOLDER = "<｜deepseek_image｜>"
# id -> special token. 0, 1: config.json's bos/eos; 129257..129261: vLLM's sentinels (checked by
# the processor); the others' ids are assigned here (nothing in vLLM reads them by id).
SPECIAL = {
    0: "<｜begin▁of▁sentence｜>",
    1: "<｜end▁of▁sentence｜>",
    2: "<｜▁pad▁｜>",
    128798: "<think>",
    128799: "</think>",
    128803: "<｜User｜>",
    128804: "<｜Assistant｜>",
    128805: "<｜latest_reminder｜>",
    **{SENTINEL_BASE + i: f"<|place_holder_mm_span_{431 + i:04d}|>" for i in range(5)},
    129264: IMAGE_PLACEHOLDER,
}
LEARNT_BASE = 3
CORPUS = ("You are a helpful assistant. Describe the image in detail: the colours, the shapes "
          "and the text on it. A red square on a white background, 12 34 56 78 90.")


def config() -> dict:
    cfg = json.loads(TEXT.read_text())
    assert cfg["model_type"] == "deepseek_v4" and not any(k.startswith("vision_") for k in cfg)
    cfg.update(VISION)
    return cfg


def tokenizer():
    from tokenizers import (AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors,
                            trainers)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([CORPUS] * 4, trainer)
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    data["model"]["vocab"] = {t: LEARNT_BASE + i for t, i in vocab.items()}
    assert LEARNT_BASE + len(vocab) <= min(SPECIAL.keys() - {0, 1, 2})
    tok = Tokenizer.from_str(json.dumps(data))
    # Added tokens take the next free id: insert them in id order after padding the vocabulary
    # with the specials themselves at their ids (the BPE model then owns the ids; the added-token
    # entries make them split out of text and mark them special).
    data = json.loads(tok.to_str())
    for i, t in SPECIAL.items():
        data["model"]["vocab"][t] = i
    tok = Tokenizer.from_str(json.dumps(data))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for _, t in sorted(SPECIAL.items())])
    bos = SPECIAL[0]  # add_special_tokens prepends BOS (tokenizer_config.json's add_bos_token)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, 0)])
    for i, t in SPECIAL.items():
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t), i)
    return tok


def tokenizer_config(cfg: dict) -> dict:
    return {
        "tokenizer_class": "TokenizersBackend",
        "model_max_length": cfg["max_position_embeddings"],
        "bos_token": SPECIAL[0],
        "eos_token": SPECIAL[1],
        "pad_token": SPECIAL[2],
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
    }


def build(out: Path) -> dict:
    cfg = config()
    (out / "config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    tok = tokenizer()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(cfg), indent=2, ensure_ascii=False) + "\n")
    return {"vocab_size": cfg["vocab_size"], "tokenizer_size": tok.get_vocab_size(),
            "image_placeholder_id": tok.token_to_id(IMAGE_PLACEHOLDER),
            "sentinel_ids": [tok.token_to_id(SPECIAL[SENTINEL_BASE + i]) for i in range(5)]}


if __name__ == "__main__":
    print(json.dumps(build(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)))
