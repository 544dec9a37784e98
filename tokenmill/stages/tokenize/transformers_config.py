"""`tokenizer_config.json` and `special_tokens_map.json` beside `tokenizer.json`, so that
`transformers.AutoTokenizer.from_pretrained(folder)` has bos/eos/pad set and a chat template whose
`apply_chat_template` renders exactly the tokens tokenmill's sft rendering writes (render.py, docs/format.md):
`<s><|system|>S<|end|><|user|>U<|end|><|assistant|>A<|end|></s>`. The assistant content and its `<|end|>` sit in a
`{% generation %}` block, so `return_assistant_tokens_mask=True` gives tokenmill's loss mask; with
`add_generation_prompt=True` the render stops after `<|assistant|>` (the dpo/grpo prompt).

One difference stays: tokenmill inserts special tokens by id, so a literal "</s>" inside a message is text, where
a transformers tokenizer matches it as the special token.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tokenmill.common.io import atomic_write_text
from tokenmill_loader.format import PAD_TOKEN, ROLE_TOKENS, SPECIAL_TOKENS

TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
BOS_TOKEN, EOS_TOKEN = SPECIAL_TOKENS[0], SPECIAL_TOKENS[1]
END_TOKEN = "<|end|>"

CHAT_TEMPLATE = (
    "{% set role_tokens = " + json.dumps(ROLE_TOKENS) + " %}"
    "{{ " + json.dumps(BOS_TOKEN) + " }}"
    "{% for message in messages %}"
    "{% if message['role'] not in role_tokens %}"
    "{{ raise_exception('unknown role ' + message['role'] + ': tokenmill renders system, user and assistant') }}"
    "{% endif %}"
    "{{ role_tokens[message['role']] }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + " + json.dumps(END_TOKEN) + " }}{% endgeneration %}"
    "{% else %}{{ message['content'] + " + json.dumps(END_TOKEN) + " }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ role_tokens['assistant'] }}{% else %}{{ "
    + json.dumps(EOS_TOKEN)
    + " }}{% endif %}"
)
SPECIAL_TOKENS_MAP = {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN}


def _json(obj: dict) -> str:
    return json.dumps(obj, ensure_ascii=False, indent=2) + "\n"


def write_transformers_config(tokenizer_dir: str | os.PathLike) -> list[str]:
    """Writes the two files next to `tokenizer_dir/tokenizer.json` (atomically, same bytes every time); returns
    their names."""
    tokenizer_dir = Path(tokenizer_dir)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **SPECIAL_TOKENS_MAP,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,  # byte-level BPE decodes spaces exactly
        "model_input_names": ["input_ids", "attention_mask"],
    }
    atomic_write_text(tokenizer_dir / TOKENIZER_CONFIG_FILE, _json(config))
    atomic_write_text(tokenizer_dir / SPECIAL_TOKENS_MAP_FILE, _json(SPECIAL_TOKENS_MAP))
    return [TOKENIZER_CONFIG_FILE, SPECIAL_TOKENS_MAP_FILE]
