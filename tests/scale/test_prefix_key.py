"""The web's prefix key is the block manager's own hash of the same prompt blocks.

The engine side renders the prompt with transformers (engine/prompt.py) and hashes blocks
in the block manager; the web side renders with jinja2 + ``tokenizers`` (web/routing.py).
Both must land on the same number, or routing would never find a cache."""
from pathlib import Path

import pytest

from core.settings import DEFAULT_MODEL, load_settings
from engine.paged.block_manager import BlockManager
from engine.prompt import build_prompt
from engine.types import GenerationRequest
from core.model_source import local_model_dir as model_folder
from web.routing import PrefixKeyer, format_key

BLOCK = 16
SYSTEM = ("You are a careful reviewer of pull requests. Explain every finding, cite the line, and "
          "propose a fix. Déjà vu: 数学 ∑ emojis 🚀 too. ") * 6
REAL_MODEL = model_folder(load_settings(model=DEFAULT_MODEL))


def engine_hashes(folder: Path, request: GenerationRequest) -> tuple[list[int], int]:
    from transformers import AutoTokenizer

    prompt = build_prompt(AutoTokenizer.from_pretrained(str(folder)), request)
    manager = BlockManager(num_blocks=256, block_size=BLOCK)
    manager.allocate("seq", prompt.ids)
    manager.commit("seq", len(prompt.ids))
    return manager._seqs["seq"].hashes, prompt.prefix_len


def check_agreement(folder: Path) -> None:
    keyer = PrefixKeyer(folder, BLOCK, min_tokens=BLOCK)
    for stored, request in [
        ({"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Review #12"}]},
         GenerationRequest(messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Review #12"}])),
        ({"messages": [{"role": "user", "content": "hi"}], "prefix": SYSTEM},
         GenerationRequest(messages=[{"role": "user", "content": "hi"}], prefix=SYSTEM)),
    ]:
        hashes, prefix_len = engine_hashes(folder, request)
        key, covered = keyer.key(stored)
        assert covered == prefix_len // BLOCK * BLOCK and covered > 0
        assert key == format_key(hashes[covered // BLOCK - 1])


def test_tiny_model_keys_agree(tiny_model):
    check_agreement(tiny_model)


@pytest.mark.slow  # the default model's tokenizer
@pytest.mark.skipif(REAL_MODEL is None or not (REAL_MODEL / "tokenizer.json").is_file(),
                    reason="the default model is not prepared here")
def test_default_model_keys_agree():
    check_agreement(REAL_MODEL)


def test_no_system_part_or_short_prefix_gives_no_key(tiny_model):
    keyer = PrefixKeyer(tiny_model, BLOCK, min_tokens=64)
    assert keyer.key({"messages": [{"role": "user", "content": SYSTEM}]}) == (None, 0)
    assert keyer.key({"messages": [{"role": "user", "content": "x"}], "prefix": "Be brief."}) == (None, 0)
    assert PrefixKeyer(None, BLOCK, 64).key({"messages": [], "prefix": SYSTEM}) == (None, 0)


def test_text_the_tokenizer_refuses_is_simply_not_routed(tiny_model):
    keyer = PrefixKeyer(tiny_model, BLOCK, min_tokens=BLOCK)
    request = {"messages": [{"role": "user", "content": "x"}], "prefix": "a lone \ud92d surrogate " * 20}
    assert keyer.key(request) == (None, 0)  # tokenizers raises on it; the submission must not fail
