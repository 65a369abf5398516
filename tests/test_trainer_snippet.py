"""experiments.finetune_rotation.trainer_snippet: the Trainer snippet of docs/fine-tuning.md run on given folders,
measured after each stage."""

import json

import numpy as np
import pytest
import torch
from conftest import tiny_lookwhere_config
from PIL import Image
from transformers import AutoImageProcessor, AutoModelForImageClassification

from experiments.finetune_rotation import trainer_snippet
from corevision_hf import LookWhereModel, save_model_folder


def rotation_folder(root, photos: int, seed: int) -> str:
    """examples/rotation_task.py's layout: {photo}_{crop}.png in upright/ and upside_down/ (the twin flipped)."""
    rng = np.random.default_rng(seed)
    for name in ("upright", "upside_down"):
        (root / name).mkdir(parents=True)
    for photo in range(photos):
        for crop in range(2):
            pixels = np.zeros((40, 40, 3), dtype=np.uint8)
            pixels[:20] = rng.integers(150, 255, size=3)  # a bright top: the way up
            Image.fromarray(pixels).save(root / "upright" / f"p{photo}_{crop}.png")
            Image.fromarray(pixels[::-1].copy()).save(root / "upside_down" / f"p{photo}_{crop}.png")
    return str(root)


def test_the_snippet_runs_on_the_given_folders_and_measures_the_model_it_saved(tmp_path):
    torch.manual_seed(0)
    save_model_folder(LookWhereModel(tiny_lookwhere_config(image_size=56, selector_image_size=28)), tmp_path / "lw")
    (tmp_path / "users-file.txt").write_text("the user's")
    (tmp_path / "result.json.tmp").symlink_to(tmp_path / "users-file.txt")  # the old temporary name: not followed
    result = trainer_snippet.main([
        "--model", str(tmp_path / "lw"), "--data", rotation_folder(tmp_path / "train", 10, 0),
        "--eval-data", rotation_folder(tmp_path / "heldout", 3, 1), "--output-dir", str(tmp_path / "trainer"),
        "--output", str(tmp_path / "result.json")])
    assert json.loads((tmp_path / "result.json").read_text())["finetuned_correct"] == result["finetuned_correct"]
    assert (tmp_path / "users-file.txt").read_text() == "the user's"
    final = tmp_path / "trainer" / "final"  # the snippet's save_pretrained, under --output-dir
    model = AutoModelForImageClassification.from_pretrained(final, trust_remote_code=True).eval()
    processor = AutoImageProcessor.from_pretrained(final, trust_remote_code=True)
    files = sorted((tmp_path / "heldout" / "upright").glob("*.png")) + sorted(
        (tmp_path / "heldout" / "upside_down").glob("*.png"))
    labels = [0] * 6 + [1] * 6
    with torch.no_grad():
        inputs = processor([Image.open(path).convert("RGB") for path in files], size={"shortest_edge": 224})
        predicted = model(**inputs, k_ratio=0.5).logits.argmax(-1).tolist()
    assert result["finetuned_correct"] == "".join(str(int(p == label)) for p, label in zip(predicted, labels))
    head, tuned = (np.array([int(c) for c in result[key]]) for key in ("head_correct", "finetuned_correct"))
    assert result["finetuned_minus_head"]["difference"] == (tuned - head).mean()
    assert result["finetuned_minus_head"]["groups"] == 3
    with pytest.raises(ValueError, match="already holds the snippet's final/ model"):  # a second run keeps the first
        trainer_snippet.main(["--model", str(tmp_path / "lw"), "--data", str(tmp_path / "train"), "--eval-data",
                              str(tmp_path / "heldout"), "--output-dir", str(tmp_path / "trainer")])


def test_folders_without_the_same_classes_are_one_error(tmp_path):
    rotation_folder(tmp_path / "train", 2, 0)
    (tmp_path / "heldout" / "upright").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"must hold the same class sub-folders .* found \['upright', 'upside_down'\] "
                                         r"and \[\]"):
        trainer_snippet.main(["--model", str(tmp_path), "--data", str(tmp_path / "train"), "--eval-data",
                              str(tmp_path / "heldout"), "--output", str(tmp_path / "out.json")])
    assert not (tmp_path / "out.json").exists()
