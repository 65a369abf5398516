"""Checkpoints saved by earlier versions of LookWhere still load, with the same outputs: the package's classes and the
hub code (trust_remote_code, package not importable) both apply the hub file's `LEGACY_KEYS` table. The fixture
(tests/fixtures/legacy/lookwhere_v0, made by its make.py at commit 12145b7) holds fused `attention.qkv` /
`attention.proj` keys and the outputs that code gave. "The same" is to float32 rounding (ATOL): split q/k/v matmuls
round differently from the fused one, by how much depends on the CPU's kernels; a wrong conversion is off by about 1."""

import shutil
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import load_without_package
from safetensors import safe_open

from corevision_hf import LookWhereForImageClassification, LookWhereModel, save_model_folder

LEGACY = Path(__file__).resolve().parent / "fixtures" / "legacy" / "lookwhere_v0"
FUSED = ("attention.qkv.", "attention.proj.")
ATOL = 1e-5


@pytest.fixture(scope="module")
def reference() -> dict:
    return torch.load(LEGACY / "outputs.pt")


def saved_keys(folder) -> set[str]:
    with safe_open(Path(folder) / "model.safetensors", "pt") as file:
        return set(file.keys())


def test_fixture_holds_the_old_keys():
    """The fixture is what the old code wrote, so the tests below exercise the conversion."""
    for name in ("model", "classifier"):
        keys = saved_keys(LEGACY / name)
        assert any(".attention.qkv.weight" in key for key in keys) and not any("q_proj" in key for key in keys)


def test_old_checkpoints_load_with_their_outputs(reference):
    model, info = LookWhereModel.from_pretrained(LEGACY / "model", output_loading_info=True)
    head, head_info = LookWhereForImageClassification.from_pretrained(LEGACY / "classifier", output_loading_info=True)
    for loading in (info, head_info):
        assert not loading["missing_keys"] and not loading["unexpected_keys"] and not loading["mismatched_keys"]
    with torch.no_grad():
        outputs = model.eval()(reference["images"], k=reference["k"])
        logits = head.eval()(reference["images"], k=reference["k"]).logits
    torch.testing.assert_close(outputs.last_hidden_state, reference["last_hidden_state"], atol=ATOL, rtol=0)
    torch.testing.assert_close(outputs.selector_map, reference["selector_map"], atol=ATOL, rtol=0)
    assert torch.equal(outputs.selected_indices, reference["selected_indices"])
    torch.testing.assert_close(logits, reference["logits"], atol=ATOL, rtol=0)


def test_saving_writes_todays_names(tmp_path, reference):
    """transformers reverses a checkpoint conversion on save; ours is one-way, so an old checkpoint saved again, and a
    new model, get q_proj / k_proj / v_proj / o_proj, and the resaved one loads with the same outputs."""
    LookWhereModel.from_pretrained(LEGACY / "model").save_pretrained(tmp_path / "resaved")
    LookWhereModel(LookWhereModel.config_class.from_pretrained(LEGACY / "model")).save_pretrained(tmp_path / "new")
    for folder in ("resaved", "new"):
        keys = saved_keys(tmp_path / folder)
        assert not any(fused in key for key in keys for fused in FUSED)
        assert {f"extractor.layers.0.attention.{p}_proj.weight" for p in "qkvo"} <= keys
    with torch.no_grad():
        outputs = LookWhereModel.from_pretrained(tmp_path / "resaved").eval()(reference["images"], k=reference["k"])
    torch.testing.assert_close(outputs.last_hidden_state, reference["last_hidden_state"], atol=ATOL, rtol=0)


LOADER = textwrap.dedent("""
    import torch
    from transformers import AutoModel, AutoModelForImageClassification

    source, inputs_path, outputs_path = sys.argv[1:]
    inputs = torch.load(inputs_path)
    with torch.no_grad():
        model = AutoModel.from_pretrained(source + "/model", trust_remote_code=True).eval()
        head = AutoModelForImageClassification.from_pretrained(source + "/classifier", trust_remote_code=True).eval()
        outputs = {"last_hidden_state": model(inputs, k=10).last_hidden_state, "logits": head(inputs, k=10).logits,
                   "module": type(model).__module__}
    torch.save(outputs, outputs_path)
""")


def test_old_checkpoints_load_through_hub_code(tmp_path, reference):
    """Today's hub files beside an old checkpoint (its config.json and weights), loaded where corevision_hf cannot be
    imported."""
    for name, cls in (("model", LookWhereModel), ("classifier", LookWhereForImageClassification)):
        save_model_folder(cls.from_pretrained(LEGACY / name), tmp_path / "hub" / name)  # the hub files
        for file in ("config.json", "model.safetensors"):
            shutil.copy(LEGACY / name / file, tmp_path / "hub" / name / file)
    assert ".attention.qkv.weight" in " ".join(saved_keys(tmp_path / "hub" / "model"))
    outputs = load_without_package(tmp_path, LOADER, str(tmp_path / "hub"), reference["images"])
    assert outputs["module"].startswith("transformers_modules")
    torch.testing.assert_close(outputs["last_hidden_state"], reference["last_hidden_state"], atol=ATOL, rtol=0)
    torch.testing.assert_close(outputs["logits"], reference["logits"], atol=ATOL, rtol=0)
