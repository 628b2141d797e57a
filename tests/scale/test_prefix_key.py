"""The web's prefix key is the block manager's own hash of the same prompt blocks.

The engine side renders the prompt with transformers (engine/prompt.py) and hashes blocks
in the block manager; the web side renders with jinja2 + ``tokenizers`` once per request
(web/prompt_text.py) and hashes the system block's ids (web/routing.py). Both must land on
the same number, or routing would never find a cache."""
from pathlib import Path

import pytest

from core.settings import DEFAULT_MODEL, load_settings
from engine.paged.block_manager import BlockManager
from engine.prompt import build_prompt
from engine.types import GenerationRequest
from core.model_source import local_model_dir as model_folder
from web.model_texts import _from_folder
from web.prompt_text import count
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


def web_key(folder: Path | None, keyer: PrefixKeyer, stored: dict) -> tuple[str | None, int]:
    model = _from_folder(folder)
    return keyer.key(count(model, stored).system_ids if model is not None else None)


def check_agreement(folder: Path) -> None:
    keyer = PrefixKeyer(BLOCK, min_tokens=BLOCK)
    for stored, request in [
        ({"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Review #12"}]},
         GenerationRequest(messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Review #12"}])),
        ({"messages": [{"role": "user", "content": "hi"}], "prefix": SYSTEM},
         GenerationRequest(messages=[{"role": "user", "content": "hi"}], prefix=SYSTEM)),
    ]:
        hashes, prefix_len = engine_hashes(folder, request)
        key, covered = web_key(folder, keyer, stored)
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
    keyer = PrefixKeyer(BLOCK, min_tokens=64)
    assert web_key(tiny_model, keyer, {"messages": [{"role": "user", "content": SYSTEM}]}) == (None, 0)
    assert web_key(tiny_model, keyer, {"messages": [{"role": "user", "content": "x"}], "prefix": "Be brief."}) == (None, 0)
    assert web_key(None, keyer, {"messages": [], "prefix": SYSTEM}) == (None, 0)


def test_a_key_names_the_same_blocks_with_tools_in_the_system_block(tiny_model):
    """With tools, the template writes them into the system block: the web's render has them too."""
    tools = [{"type": "function", "function": {"name": "lookup", "description": "Find a record " * 8,
                                               "parameters": {"type": "object", "properties": {}}}}]
    request = GenerationRequest(messages=[{"role": "user", "content": "hi"}], prefix=SYSTEM, tools=tools)
    hashes, prefix_len = engine_hashes(tiny_model, request)
    key, covered = web_key(tiny_model, PrefixKeyer(BLOCK, min_tokens=BLOCK),
                           {"messages": [{"role": "user", "content": "hi"}], "prefix": SYSTEM, "tools": tools})
    assert covered == prefix_len // BLOCK * BLOCK and key == format_key(hashes[covered // BLOCK - 1])
