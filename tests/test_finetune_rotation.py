"""experiments.finetune_rotation.finetune_rotation: the paired bootstrap of two runs' held-out predictions; and
examples/rotation_task.py, the task it was run on."""

import os
import shutil

import pytest

from experiments.finetune_rotation.finetune_rotation import paired_bootstrap


def test_paired_bootstrap_resamples_the_images_once_for_both_runs():
    first, second = "10110110", "00100110"
    result = paired_bootstrap(first, second, 2000, 0)
    assert result["difference"] == pytest.approx(2 / 8)
    low, high = result["interval_95"]
    assert 0 <= low < 2 / 8 < high <= 4 / 8  # paired: a draw can never make the second run better here
    assert result == paired_bootstrap(first, second, 2000, 0)
    assert paired_bootstrap(first, first, 2000, 0)["interval_95"] == [0.0, 0.0]


def test_grouped_bootstrap_resamples_whole_groups_and_weighs_by_their_images():
    first, second = "1111" "10" "00", "0000" "10" "00"  # group a: +1 on 4 images; b, c: 0 on 2 each
    groups = ["a"] * 4 + ["b"] * 2 + ["c"] * 2
    result = paired_bootstrap(first, second, 4000, 0, groups)
    assert result["difference"] == pytest.approx(4 / 8) and result["groups"] == 3
    # every draw's mean is (4 x the times a is drawn) / (images drawn): 0, 4/8, 8/10 or 12/12; the interval spans them
    assert result["interval_95"] == [0.0, 1.0]
    # image-wise resampling of the same strings claims a far narrower interval
    low, high = paired_bootstrap(first, second, 4000, 0)["interval_95"]
    assert 0 < low and high < 1
    with pytest.raises(ValueError, match="different held-out sets"):
        paired_bootstrap(first, second[:-1], 10, 0)


def test_group_keys_follow_the_val_groups_rule():
    from experiments.finetune_rotation.finetune_rotation import group_keys

    files = ["upright/beach_0.png", "upside_down/beach_0.png", "upright/beach_11.png", "upright/odd.png"]
    assert group_keys(files, r"(.+)_\d+$") == ["beach", "beach", "beach", "odd"]


def test_rotation_task_writes_heldout_crops_per_photo_and_the_same_training_folder(tmp_path):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "rotation_task.py"
    spec = importlib.util.spec_from_file_location("rotation_task", path)
    task = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(task)
    photos = len(task.photos([task.HELDOUT_PHOTOS]))
    task.main(["--output-dir", str(tmp_path / "one"), "--train-images", "50", "--size", "28"])
    task.main(["--output-dir", str(tmp_path / "three"), "--train-images", "50", "--size", "28", "--heldout-crops", "3"])
    held_out = sorted(p.relative_to(tmp_path / "three" / "heldout").as_posix()
                      for p in (tmp_path / "three" / "heldout").rglob("*.png"))
    assert len(held_out) == 2 * 3 * photos  # both ways up, three crops of each photo
    assert {name.rsplit("_", 1)[1] for name in held_out} == {"0.png", "1.png", "2.png"}
    # the training crops are drawn first: more held-out crops leave the training folder as it was, bit for bit
    one, three = tmp_path / "one" / "train", tmp_path / "three" / "train"
    assert len(list(one.rglob("*.png"))) == 50
    for image in one.rglob("*.png"):
        assert image.read_bytes() == (three / image.relative_to(one)).read_bytes()
    # validation crops are drawn last: with them, train/ and heldout/ are the same bits
    task.main(["--output-dir", str(tmp_path / "val"), "--train-images", "50", "--size", "28", "--val-crops", "2"])
    val = sorted(p.relative_to(tmp_path / "val" / "val").as_posix() for p in (tmp_path / "val" / "val").rglob("*.png"))
    assert len(val) == 2 * 2 * len(task.photos([task.VAL_PHOTOS])) and "upside_down/kite_1.png" in val
    for split in ("train", "heldout"):
        for image in (tmp_path / "one" / split).rglob("*.png"):
            assert image.read_bytes() == (tmp_path / "val" / split / image.relative_to(tmp_path / "one" / split)
                                          ).read_bytes()
    assert not (tmp_path / "one" / "val").exists()
    for bad in (["--heldout-crops", "0"], ["--val-crops", "-1"]):
        with pytest.raises(SystemExit):
            task.main(["--output-dir", str(tmp_path / "bad"), "--train-images", "50", *bad])


def test_rotation_task_crops_another_folder_of_photos_for_heldout_with_the_same_training_folder(tmp_path):
    import importlib.util
    from pathlib import Path

    from PIL import Image

    path = Path(__file__).resolve().parents[1] / "examples" / "rotation_task.py"
    spec = importlib.util.spec_from_file_location("rotation_task", path)
    task = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(task)
    photos = tmp_path / "photos"
    photos.mkdir()
    Image.new("RGB", (64, 48), (200, 20, 20)).save(photos / "red-wall.webp", lossless=True)
    Image.new("RGB", (40, 60), (20, 200, 20)).save(photos / "green_field.png")
    (photos / "SOURCES.md").write_text("not a photo")
    task.main(["--output-dir", str(tmp_path / "own"), "--train-images", "50", "--size", "28"])
    task.main(["--output-dir", str(tmp_path / "other"), "--train-images", "50", "--size", "28", "--heldout-photos",
               str(photos), "--heldout-crops", "2"])
    held_out = sorted(p.relative_to(tmp_path / "other" / "heldout").as_posix()
                      for p in (tmp_path / "other" / "heldout").rglob("*"))
    assert held_out == ["upright", *(f"upright/{name}_{i}.png" for name in ("green_field", "red-wall") for i in (0, 1)),
                        "upside_down", *(f"upside_down/{name}_{i}.png" for name in ("green_field", "red-wall")
                                         for i in (0, 1))]
    crop = Image.open(tmp_path / "other" / "heldout" / "upright" / "red-wall_1.png")
    assert crop.size == (28, 28) and crop.getpixel((14, 14)) == (200, 20, 20)  # a crop of that photo
    for image in (tmp_path / "own" / "train").rglob("*.png"):  # drawn first: the same bits whatever is held out
        assert image.read_bytes() == (tmp_path / "other" / "train" / image.relative_to(tmp_path / "own" / "train")
                                      ).read_bytes()
    shutil.copy(task.photos(task.TRAIN_PHOTOS)[3], photos / "renamed.jpg")
    for bad in (tmp_path / "nowhere", tmp_path / "own", photos):  # no folder; no photos; a training photo among them
        with pytest.raises(SystemExit):
            task.main(["--output-dir", str(tmp_path / "bad"), "--heldout-photos", str(bad)])
    assert not (tmp_path / "bad").exists()


def test_per_group_accuracy_and_the_groups_given_one_class():
    from experiments.finetune_rotation.finetune_rotation import per_group

    # two photos, two images each (one per class): the probe calls both images of "a" class 1, so half of a is right
    runs = {"fine_tuned": {"heldout_correct": "1111", "heldout_predicted": [0, 1, 0, 1]},
            "probe": {"heldout_correct": "0110", "heldout_predicted": [1, 1, 1, 0]}}
    table = per_group(runs, ["a", "a", "b", "b"])
    assert table == {
        "a": {"images": 2, "fine_tuned": {"accuracy": 1.0, "one_class": False},
              "probe": {"accuracy": 0.5, "one_class": True}},
        "b": {"images": 2, "fine_tuned": {"accuracy": 1.0, "one_class": False},
              "probe": {"accuracy": 0.5, "one_class": False}},
    }


def test_the_benchmark_scores_best_or_final_of_real_runs_against_the_probe(tmp_path):
    """Two tiny runs (a probe alone, one epoch of fine-tuning): each folder's held-out accuracy as evaluated by hand,
    and their difference."""
    import torch
    from conftest import tiny_lookwhere_config
    from safetensors.torch import load_file, save_file
    from test_finetune import write_folder
    from transformers import AutoModelForImageClassification

    from experiments.finetune_rotation.finetune_rotation import main
    from corevision_hf import LookWhereModel, save_model_folder
    from evaluation.probes import load_image
    from training import finetune

    torch.manual_seed(0)
    save_model_folder(LookWhereModel(tiny_lookwhere_config()), tmp_path / "model")
    train, heldout = write_folder(tmp_path / "train", 6, seed=0), write_folder(tmp_path / "heldout", 4, seed=1)
    for name, epochs in (("probe", "0"), ("ft", "1")):
        finetune.main([str(tmp_path / "model"), "--data", train, "--eval-data", heldout, "--output-dir",
                       str(tmp_path / name), "--epochs", epochs, "--lr", "1e-2", "--batch-size", "4",
                       "--k-ratio", "0.5", "--eval-k-ratio", "0.5", "--val-fraction", "0.34"])
    final = tmp_path / "ft" / "final" / "model.safetensors"
    state = load_file(final)
    save_file({name: -value if name.startswith("classifier.") else value for name, value in state.items()}, final,
              metadata={"format": "pt"})  # final/'s head negated: it calls every image the other class than best/
    examples = finetune.labelled_files(heldout, train=False)[0]
    pixels, labels = torch.stack([load_image(path, 32) for path, _ in examples]), [label for _, label in examples]

    def by_hand(folder, images=pixels, truth=labels) -> str:
        model = AutoModelForImageClassification.from_pretrained(folder, trust_remote_code=True).eval()
        with torch.no_grad():
            predicted = model(images, k_ratio=0.5).logits.argmax(-1).tolist()
        return "".join(str(int(p == label)) for p, label in zip(predicted, truth))

    for weights in ("best", "final"):
        pair = main(["--pair", "p", str(tmp_path / "ft"), str(tmp_path / "probe"), "--fine-tuned", weights,
                     "--hindsight-probes", "1e-2,1e3", "--output", str(tmp_path / f"{weights}.json")])["pairs"]["p"]
        assert pair["fine_tuned"]["weights"] == weights and pair["probe"]["weights"] == "best"
        assert pair["fine_tuned"]["heldout_correct"] == by_hand(tmp_path / "ft" / weights)
        assert pair["probe"]["heldout_correct"] == by_hand(tmp_path / "probe" / "best")
        assert pair["fine_tuned"]["heldout_accuracy"] == {"best": 1.0, "final": 0.0}[weights]  # bright vs dark
        expected = (pair["fine_tuned"]["heldout_correct"].count("1") - pair["probe"]["heldout_correct"].count("1")) / 8
        assert pair["fine_tuned_minus_probe_heldout"]["difference"] == pytest.approx(expected)
        refitted = pair["hindsight_probes"]
        assert refitted["0.01"]["heldout_correct"] == pair["probe"]["heldout_correct"]  # the run's own penalty
        assert refitted["1000"]["fine_tuned_minus_probe_heldout"]["difference"] == pytest.approx(
            (pair["fine_tuned"]["heldout_correct"].count("1") - refitted["1000"]["heldout_correct"].count("1")) / 8)
    # --heldout: every run scored on another folder (three images a class), the probes refitted and scored there too
    other = write_folder(tmp_path / "other", 3, seed=2)
    others = finetune.labelled_files(other, train=False)[0]
    other_pixels = torch.stack([load_image(path, 32) for path, _ in others])
    other_labels = [label for _, label in others]
    pair = main(["--pair", "p", str(tmp_path / "ft"), str(tmp_path / "probe"), "--fine-tuned", "final", "--heldout",
                 other, "--hindsight-probes", "1e-2", "--output", str(tmp_path / "other.json")])["pairs"]["p"]
    assert pair["probe"]["heldout_files"] == [os.path.relpath(path, other) for path, _ in others]
    assert pair["fine_tuned"]["heldout_correct"] == by_hand(tmp_path / "ft" / "final", other_pixels, other_labels)
    assert pair["probe"]["heldout_correct"] == by_hand(tmp_path / "probe" / "best", other_pixels, other_labels)
    assert pair["hindsight_probes"]["0.01"]["heldout_correct"] == pair["probe"]["heldout_correct"]
    renamed = tmp_path / "renamed"
    for index, name in enumerate(sorted(os.listdir(other))):  # the same images under other class names
        shutil.copytree(os.path.join(other, name), renamed / f"class{index}")
    with pytest.raises(ValueError, match="classes"):
        main(["--pair", "p", str(tmp_path / "ft"), str(tmp_path / "probe"), "--heldout", str(renamed)])
    for bad in (["--hindsight-probes", "0"], ["--heldout", str(tmp_path / "nowhere")]):
        with pytest.raises(SystemExit):
            main(["--pair", "p", str(tmp_path / "ft"), str(tmp_path / "probe"), *bad])


def test_cross_validation_keeps_whole_groups_to_a_fold():
    """Ten groups of four images, each group's features its own one-hot and its label the group's parity: with whole
    groups to a fold nothing carries to an unseen group, while folds of single images score by memorising the group."""
    import torch

    from experiments.finetune_rotation.finetune_rotation import cross_validated

    group = torch.arange(40) // 4
    features, labels = torch.nn.functional.one_hot(group, 10).float(), group % 2
    keys = [f"photo{index}" for index in group.tolist()]
    assert cross_validated(features, labels, keys, 1e-2) <= 0.6
    assert cross_validated(features, labels, None, 1e-2) == 1.0
