"""Checkpoints saved by earlier versions of the package (fused `attention.qkv` / `attention.proj`, blocks and coordinate
heads outside an encoder) load with the outputs they gave, through the package and through hub code alone; every save
writes today's names. "The outputs they gave" is to float32 rounding (ATOL): three q/k/v matmuls round differently
from the one fused matmul that wrote the reference, by about 1e-6 on outputs of size 1, and by how much depends on the
CPU's kernels; a wrong conversion (a swapped or transposed projection) is off by about 1. The fixture (tests/fixtures/legacy/veca_v0) was written by its make_veca_v0.py before the
change."""

import shutil
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import load_without_package
from safetensors import safe_open
from safetensors.torch import load_file

from corevision_hf import VecaForImageClassification, VecaModel

LEGACY = Path(__file__).parent / "fixtures" / "legacy" / "veca_v0"
BUDGETS = (1, 3, 8)
ATOL = 1e-5

LOADER = textwrap.dedent(
    """
    import torch
    from transformers import AutoModel, AutoModelForImageClassification

    source, inputs_path, outputs_path = sys.argv[1:4]
    inputs = torch.load(inputs_path)
    model = AutoModel.from_pretrained(source + "/model", trust_remote_code=True).eval()
    classifier = AutoModelForImageClassification.from_pretrained(source + "/classifier", trust_remote_code=True).eval()
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    with torch.no_grad():
        outputs = {f"last_hidden_state_{c}": model(inputs, num_cores=c).last_hidden_state for c in (1, 3, 8)}
        outputs["logits"] = classifier(inputs, num_cores=3).logits
    torch.save(outputs, outputs_path)
    """
)


def saved_keys(folder) -> set[str]:
    with safe_open(str(folder / "model.safetensors"), "pt") as file:
        return set(file.keys())


def check_todays_names(keys: set[str]) -> None:
    assert not any(".qkv." in key or "attention.proj." in key for key in keys), sorted(keys)
    assert all(".encoder." in key or key.startswith("encoder.") for key in keys if "layers." in key), sorted(keys)
    assert any(key.endswith("encoder.layers.1.attention.v_proj.bias") for key in keys)
    assert any(key.endswith("encoder.coordinate_heads.0.proj.weight") for key in keys)


def test_the_fixture_holds_the_old_layout():
    """What makes this file's tests mean something: the fixture's keys are the ones earlier versions wrote."""
    keys = saved_keys(LEGACY / "model")
    assert "layers.0.attention.qkv.weight" in keys and "layers.1.attention.proj.bias" in keys
    assert "coordinate_heads.0.alpha" in keys and not any("q_proj" in key for key in keys)


@torch.no_grad()
def test_checkpoints_saved_by_earlier_versions_load_with_their_outputs():
    reference = load_file(LEGACY / "reference.safetensors")
    model = VecaModel.from_pretrained(LEGACY / "model").eval()
    for cores in BUDGETS:
        torch.testing.assert_close(model(reference["pixel_values"], num_cores=cores).last_hidden_state,
                                   reference[f"last_hidden_state_{cores}"], atol=ATOL, rtol=0)
    classifier = VecaForImageClassification.from_pretrained(LEGACY / "classifier").eval()
    torch.testing.assert_close(classifier(reference["pixel_values"], num_cores=3).logits, reference["logits"],
                               atol=ATOL, rtol=0)


@torch.no_grad()
def test_every_save_writes_todays_names(tmp_path):
    """transformers reverses a load's conversions when it saves; the legacy ones are not reversed, so an old
    checkpoint saved again, a fresh model and a classifier all write today's names, and load back unchanged."""
    reference = load_file(LEGACY / "reference.safetensors")
    old = VecaModel.from_pretrained(LEGACY / "model").eval()
    old.save_pretrained(tmp_path / "resaved")
    VecaModel(old.config).save_pretrained(tmp_path / "fresh")
    VecaForImageClassification.from_pretrained(LEGACY / "classifier").save_pretrained(tmp_path / "classifier")
    for folder in ("resaved", "fresh", "classifier"):
        check_todays_names(saved_keys(tmp_path / folder))
    resaved = VecaModel.from_pretrained(tmp_path / "resaved").eval()
    pixel_values = reference["pixel_values"]
    torch.testing.assert_close(resaved(pixel_values, num_cores=3).last_hidden_state,  # the same code: the same bits
                               old(pixel_values, num_cores=3).last_hidden_state, atol=0, rtol=0)


@pytest.mark.slow
def test_checkpoints_saved_by_earlier_versions_load_through_todays_hub_code(tmp_path):
    """An old hub repo whose code files are replaced by today's (its weights and config kept) loads in a Python that
    cannot import corevision_hf, with the outputs it gave."""
    for name, model_class in (("model", VecaModel), ("classifier", VecaForImageClassification)):
        model_class.from_pretrained(LEGACY / name).save_pretrained(tmp_path / "repo" / name)  # today's code files
        for file in ("config.json", "model.safetensors"):
            shutil.copy(LEGACY / name / file, tmp_path / "repo" / name / file)
    assert "layers.0.attention.qkv.weight" in saved_keys(tmp_path / "repo" / "model")
    reference = load_file(LEGACY / "reference.safetensors")
    outputs = load_without_package(tmp_path, LOADER, str(tmp_path / "repo"), reference["pixel_values"])
    for key, value in outputs.items():
        torch.testing.assert_close(value, reference[key], atol=ATOL, rtol=0, msg=f"output {key!r} differs")
