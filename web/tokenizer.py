"""A prepared model folder's ``tokenizer.json``, loaded once per web process and shared.

The web holds no model, only the fast ``tokenizers`` library: the web's own model is read
from its folder here; other models come from what their workers publish
(web/model_texts.py). The ``tokenizers`` Tokenizer is safe to share between threads.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any


@functools.lru_cache(maxsize=4)
def load_tokenizer(folder: Path | None) -> Any | None:
    """The tokenizer of a prepared model folder, or ``None`` when it has no tokenizer.json
    (model not prepared yet, or a hub id the web cannot read)."""
    if folder is None or not (folder / "tokenizer.json").is_file():
        return None
    from tokenizers import Tokenizer  # imported here: only when the file exists

    return Tokenizer.from_file(str(folder / "tokenizer.json"))
