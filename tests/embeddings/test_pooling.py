"""Pooling, normalization and the sentence-transformers config, on small tensors and folders."""
from __future__ import annotations

import json

import pytest
import torch

from engine.embedding.model import EmbeddingConfig, pad_batch, pool, normalize
from engine.errors import ModelLoadError

ST = "sentence_transformers.models."


def st_folder(tmp_path, pooling: dict, modules=("Transformer", "Pooling", "Normalize"), max_seq=None):
    (tmp_path / "1_Pooling").mkdir()
    paths = {"Transformer": "", "Pooling": "1_Pooling", "Normalize": "2_Normalize"}
    (tmp_path / "modules.json").write_text(json.dumps(
        [{"idx": i, "name": str(i), "path": paths.get(m, m), "type": ST + m} for i, m in enumerate(modules)]))
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 4, **pooling}))
    if max_seq is not None:
        (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq}))
    return tmp_path


def test_mean_pooling_averages_only_the_real_tokens():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]],
                           [[5.0, 6.0], [100.0, 100.0], [100.0, 100.0]]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert pool(hidden, mask, "mean").tolist() == [[2.0, 3.0], [5.0, 6.0]]
    assert pool(hidden, mask, "cls").tolist() == [[1.0, 2.0], [5.0, 6.0]]


def test_normalize_gives_unit_length_and_keeps_a_zero_vector_zero():
    out = normalize(torch.tensor([[3.0, 4.0], [0.0, 0.0]]))
    assert out.tolist() == [[0.6000000238418579, 0.800000011920929], [0.0, 0.0]]


def test_pad_batch_pads_right_and_masks_the_pads():
    ids, mask = pad_batch([[101, 7, 102], [101, 102]], pad_id=0)
    assert ids.tolist() == [[101, 7, 102], [101, 102, 0]]
    assert mask.tolist() == [[1, 1, 1], [1, 1, 0]]


def test_config_reads_pooling_normalize_and_max_length(tmp_path):
    config = EmbeddingConfig.read(st_folder(tmp_path, {"pooling_mode_mean_tokens": True}, max_seq=256), 512)
    assert config == EmbeddingConfig(pooling="mean", normalize=True, max_tokens=256, dimensions=4)


def test_config_without_normalize_or_sentence_bert_config(tmp_path):
    folder = st_folder(tmp_path, {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False},
                       modules=("Transformer", "Pooling"))
    assert EmbeddingConfig.read(folder, 512) == EmbeddingConfig("cls", False, 512, 4)


@pytest.mark.parametrize("pooling, modules", [
    ({"pooling_mode_max_tokens": True}, ("Transformer", "Pooling")),
    ({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True}, ("Transformer", "Pooling")),
    ({"pooling_mode_mean_tokens": True}, ("Transformer", "Pooling", "Dense")),
])
def test_a_pooling_or_module_we_do_not_implement_is_a_load_error(tmp_path, pooling, modules):
    with pytest.raises(ModelLoadError):
        EmbeddingConfig.read(st_folder(tmp_path, pooling, modules=modules), 512)
