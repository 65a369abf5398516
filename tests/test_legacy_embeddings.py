"""Checkpoints saved before the embeddings modules owned their weights (tests/fixtures/legacy/v1, written by its
make.py: keys `core_bank.*`, `patch_embeddings.*`, `position_embeddings.weight`, `selector.cls_token`,
`extractor.prefix_tokens`, ...) load through one rename table per model (`LEGACY_KEYS`) with the outputs they gave,
bit for bit (the arithmetic is the same); saving writes today's names; and an old folder whose code files are
replaced by today's loads in a Python that cannot import corevision_hf."""

import shutil
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import load_without_package
from safetensors import safe_open
from safetensors.torch import load_file

from corevision_hf import LookWhereForImageClassification, LookWhereModel, VecaForImageClassification, VecaModel

LEGACY = Path(__file__).parent / "fixtures" / "legacy" / "v1"
CLASSES = {"veca": VecaModel, "veca_classifier": VecaForImageClassification, "lookwhere": LookWhereModel,
           "lookwhere_classifier": LookWhereForImageClassification}
OLD_NAMES = ("core_bank.", "patch_embeddings.", "position_embeddings.weight", "cls_token", "register_tokens",
             "prefix_tokens", "position_embeddings")


def outputs(name: str, model, pixel_values: torch.Tensor) -> dict[str, torch.Tensor]:
    """The fixture's outputs of `model` (saved as `name`)."""
    if name == "veca":
        return {f"veca_{c}": model(pixel_values, num_cores=c).last_hidden_state for c in (1, 3, 8)}
    if name == "veca_classifier":
        return {name: model(pixel_values, num_cores=3).logits}
    if name == "lookwhere":
        return {name: model(pixel_values, k=7).last_hidden_state}
    return {name: model(pixel_values, k=7).logits}


def saved_keys(folder: Path) -> set[str]:
    with safe_open(str(folder / "model.safetensors"), "pt") as file:
        return set(file.keys())


def old_keys(keys: set[str]) -> set[str]:
    """The keys that name a weight by its old owner (not under `embeddings.`)."""
    return {key for key in keys if "embeddings." not in key.replace("patch_embeddings.", "")
            and any(part in key for part in OLD_NAMES)}


def test_the_fixture_holds_the_old_layout():
    """What makes this file's tests mean something: every fixture names its embedding weights the old way."""
    for name in CLASSES:
        keys = saved_keys(LEGACY / name)
        assert old_keys(keys) and not any(".embeddings." in key or key.startswith("embeddings.") for key in keys)


@pytest.mark.parametrize("name", CLASSES)
@torch.no_grad()
def test_checkpoints_saved_before_load_with_their_outputs(name):
    reference = load_file(LEGACY / "reference.safetensors")
    model = CLASSES[name].from_pretrained(LEGACY / name).eval()
    for key, value in outputs(name, model, reference["pixel_values"]).items():
        torch.testing.assert_close(value, reference[key], atol=0, rtol=0, msg=key)


@pytest.mark.parametrize("name", CLASSES)
@torch.no_grad()
def test_saving_an_old_checkpoint_writes_todays_names(name, tmp_path):
    old = CLASSES[name].from_pretrained(LEGACY / name).eval()
    old.save_pretrained(tmp_path / name)
    keys = saved_keys(tmp_path / name)
    assert not old_keys(keys), sorted(old_keys(keys))
    assert keys == set(old.state_dict())
    reloaded = CLASSES[name].from_pretrained(tmp_path / name).eval()
    pixel_values = load_file(LEGACY / "reference.safetensors")["pixel_values"]
    for key, value in outputs(name, reloaded, pixel_values).items():
        torch.testing.assert_close(value, outputs(name, old, pixel_values)[key], atol=0, rtol=0)


LOADER = textwrap.dedent(
    """
    import torch
    from transformers import AutoModel, AutoModelForImageClassification

    source, inputs_path, outputs_path = sys.argv[1:4]
    pixel_values = torch.load(inputs_path)
    outputs = {}
    with torch.no_grad():
        for name in ("veca", "lookwhere"):
            model = AutoModel.from_pretrained(f"{source}/{name}", trust_remote_code=True).eval()
            assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
            outputs[name] = model(pixel_values, **({"num_cores": 3} if name == "veca" else {"k": 7})).last_hidden_state
    torch.save(outputs, outputs_path)
    """
)


@pytest.mark.slow
def test_old_folders_load_through_todays_hub_code(tmp_path):
    """An old hub repo whose code files are replaced by today's (its weights and config kept) loads with the outputs
    it gave, in a Python that cannot import corevision_hf."""
    for name in ("veca", "lookwhere"):
        CLASSES[name].from_pretrained(LEGACY / name).save_pretrained(tmp_path / "repo" / name)  # today's code files
        for file in ("config.json", "model.safetensors"):
            shutil.copy(LEGACY / name / file, tmp_path / "repo" / name / file)
        assert old_keys(saved_keys(tmp_path / "repo" / name))
    reference = load_file(LEGACY / "reference.safetensors")
    loaded = load_without_package(tmp_path, LOADER, str(tmp_path / "repo"), reference["pixel_values"])
    torch.testing.assert_close(loaded["veca"], reference["veca_3"], atol=0, rtol=0)
    torch.testing.assert_close(loaded["lookwhere"], reference["lookwhere"], atol=0, rtol=0)
