"""python -m training.finetune: LP-FT on an ImageFolder with tiny random models and generated images (two classes a
linear head can tell apart: bright and dark noise)."""

import json

import numpy as np
import pytest
import torch
from conftest import save_tiny_model_folders, tiny_lookwhere_config, tiny_veca_config
from PIL import Image
from safetensors.torch import load_file
from transformers import AutoModelForImageClassification

from corevision_hf.cli import run
from corevision_hf.images import to_pixel_values
from evaluation.probes import fit_linear_classifier, load_image
from training import finetune, finetune_augment, head_probe, labelled_folders

CLASSES = ("bright", "dark")


def write_folder(root, per_class: int, seed: int) -> str:
    """An ImageFolder of `per_class` 32 px noise images per class, bright or dark."""
    rng = np.random.default_rng(seed)
    for label, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True)
        for index in range(per_class):
            low = 96 if label == 0 else 0
            pixels = rng.integers(low, low + 160, size=(32, 32, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{index}.png")
    return str(root)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("finetune")
    return {**save_tiny_model_folders(root),
            "train": write_folder(root / "train", 10, seed=0), "heldout": write_folder(root / "heldout", 3, seed=1),
            "val": write_folder(root / "val", 5, seed=2)}


def arguments(folders, model: str, output_dir, *extra: str) -> list[str]:
    budget = ["--k-ratio", "0.25:0.75", "--eval-k-ratio", "0.5"] if model == "lookwhere" else ["--num-cores", "2,4,8"]
    return [folders[model], "--data", folders["train"], "--eval-data", folders["heldout"], "--output-dir",
            str(output_dir), "--epochs", "2", "--batch-size", "4", "--lr", "1e-3", *budget, *extra]


@pytest.mark.parametrize("model", ["lookwhere", "veca"])
def test_finetune_writes_best_and_final_that_reload_with_their_accuracy(folders, tmp_path, model):
    result = finetune.main(arguments(folders, model, tmp_path / "run"))
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["epoch"] for line in lines] == [0, 1, 2]  # the probe, then one line per epoch
    budget = {"k_ratio": 0.5} if model == "lookwhere" else {}
    for name, expected in (("best", result["heldout"]), ("final", lines[-1]["validation"])):
        folder = tmp_path / "run" / name
        assert {"README.md", "preprocessor_config.json", "config.json", "model.safetensors"} <= {
            path.name for path in folder.iterdir()}
        reloaded = AutoModelForImageClassification.from_pretrained(folder, trust_remote_code=True).eval()
        assert reloaded.config.id2label == dict(enumerate(CLASSES))
        data = folders["heldout"] if name == "best" else None
        examples = (finetune.labelled_files(data, train=False)[0] if data else
                    labelled_folders.split_validation(finetune.labelled_files(folders["train"], True)[0], 0.2, 0)[1])
        with torch.no_grad():
            pixels = torch.stack([load_image(path, 32) for path, _ in examples])
            predicted = reloaded(pixels, **budget).logits.argmax(-1)
        accuracy = (predicted == torch.tensor([label for _, label in examples])).float().mean().item()
        assert accuracy == pytest.approx(expected["accuracy"])
    assert f"{result['heldout']['accuracy']:.4f}" in (tmp_path / "run" / "best" / "README.md").read_text()
    assert result["validation"]["accuracy"] == 1.0  # bright vs dark: the probe alone separates them


def test_val_data_chooses_on_its_folder_while_all_of_data_trains(folders, tmp_path, monkeypatch, capsys):
    seen, loader = [], finetune.loader
    monkeypatch.setattr(finetune, "loader", lambda examples, *args, **kwargs: seen.append(examples) or
                        loader(examples, *args, **kwargs))
    finetune.main(arguments(folders, "veca", tmp_path / "run", "--val-data", folders["val"], "--epochs", "1"))
    train, val = (finetune.labelled_files(folders[name], train=name == "train")[0] for name in ("train", "val"))
    assert f"validation: 10 images of --val-data {folders['val']}; all 20 of --data train" in capsys.readouterr().out
    assert seen[:3] == [train, train, val]  # shuffled training batches, the probe's fixed ones, validation
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    reloaded = AutoModelForImageClassification.from_pretrained(tmp_path / "run" / "final", trust_remote_code=True)
    with torch.no_grad():
        pixels = torch.stack([load_image(path, 32) for path, _ in val])
        output = reloaded.eval()(pixels, labels=torch.tensor([label for _, label in val]))
    assert lines[-1]["validation"]["images"] == 10
    assert lines[-1]["validation"]["loss"] == pytest.approx(output.loss.item(), rel=1e-5)
    assert f"validation accuracy on 10 images of {folders['val']}:" in (tmp_path / "run" / "final" / "README.md"
                                                                        ).read_text()


def test_selector_is_untouched_and_a_second_run_gives_the_same_bits(folders, tmp_path):
    finetune.main(arguments(folders, "lookwhere", tmp_path / "a"))
    finetune.main(arguments(folders, "lookwhere", tmp_path / "b"))
    start = load_file(f"{folders['lookwhere']}/model.safetensors")
    first, second = (load_file(tmp_path / run / "final" / "model.safetensors") for run in ("a", "b"))
    selector = [name for name in start if name.startswith("selector.")]
    assert selector and all(torch.equal(first[f"lookwhere.{name}"], start[name]) for name in selector)
    assert not torch.equal(first["lookwhere.extractor.layers.0.mlp.fc1.weight"],
                           start["extractor.layers.0.mlp.fc1.weight"])  # the extractor did train
    assert first.keys() == second.keys() and all(torch.equal(first[name], second[name]) for name in first)


def test_probe_is_folded_into_the_head_exactly(monkeypatch):
    """The head after the linear probe gives the probe's logits (its standardisation folded into the weights)."""
    from corevision_hf import VecaForImageClassification

    torch.manual_seed(0)
    features, labels = torch.randn(40, 128) * 3 + 1, torch.arange(40) % 2
    model = VecaForImageClassification(tiny_veca_config(num_labels=2))  # the head reads 2 x 64 features
    monkeypatch.setattr(head_probe, "head_features", lambda *args: (features, labels))
    head_probe.fit_head(model, [], {}, "cpu", 1e-2)
    probe = fit_linear_classifier(features, labels, 2, 1e-2, per_feature=False)
    torch.testing.assert_close(model.classifier(features), probe(features), rtol=1e-4, atol=1e-4)


def test_layer_decay_scales_blocks_below_the_head():
    from corevision_hf import LookWhereForImageClassification

    model = LookWhereForImageClassification(tiny_lookwhere_config(num_labels=2))
    groups = finetune.parameter_groups(model, 1e-3, 0.05, 0.5)
    scale = {id(param): group["lr_scale"] for group in groups for param in group["params"]}
    named = dict(model.named_parameters())
    assert scale[id(named["classifier.weight"])] == 1.0
    assert scale[id(named["lookwhere.extractor.norm.weight"])] == 1.0
    assert scale[id(named["lookwhere.extractor.layers.2.mlp.fc1.weight"])] == 0.5
    assert scale[id(named["lookwhere.extractor.layers.0.mlp.fc1.weight"])] == 0.5 ** 3
    assert scale[id(named["lookwhere.extractor.embeddings.position_embeddings"])] == 0.5 ** 4
    assert not any(id(param) in scale for param in model.lookwhere.selector.parameters())  # frozen


@pytest.mark.parametrize("extra, message", [
    (["--k-ratio", "0.6:0.2"], "--k-ratio needs 0 < LOW <= HIGH <= 1"),
    (["--val-fraction", "1.5"], "argument --val-fraction: must be a number strictly between 0 and 1, got '1.5'"),
    (["--num-cores", "8"], "--num-cores and --eval-num-cores are VECA's budgets"),
    (["--layer-decay", "2"], "argument --layer-decay: must be a number in (0, 1] (lower layers train slower)"),
    (["--eval-data", "{train}"], "--eval-data shares 20 images with --data"),
    (["--val-groups", "(photo"], "--val-groups is no regular expression"),
    (["--val-data", "{val}", "--val-fraction", "0.1"], "--val-data is the validation set: --val-fraction (which"),
    (["--val-data", "{train}"], "--val-data shares 20 images with --data"),
    (["--val-data", "{heldout}"], "--val-data shares 6 images with --eval-data"),
    (["--val-data", "{val}/bright"], "bright is no ImageFolder: give one sub-folder per class"),
    (["--val-groups", "^photo"], "--val-groups '^photo' does not match"),
    (["--crop-scale", "0:1"], "--crop-scale needs 0 < LOW <= HIGH <= 1"),
    (["--crop-scale", "half"], "--crop-scale takes LOW:HIGH or one value"),
    (["--grayscale", "1.5"], "argument --grayscale: must be a probability in [0, 1], got '1.5'"),
    (["--grayscale", "nan"], "argument --grayscale: must be a probability in [0, 1], got 'nan'"),
    (["--wise-ft", "0.5,1"], "--wise-ft mixes must be in (0, 1)"),
    (["--wise-ft", "half"], "--wise-ft takes one mix or several, comma-separated"),
    (["--wise-ft", "0.5", "--epochs", "0"], "--wise-ft mixes the last epoch's weights with the probe's"),
    (["--probe-weight-decay", "1e-2,-1"], "--probe-weight-decay must be positive and finite"),
    (["--probe-weight-decay", "1e-2;1"], "--probe-weight-decay takes one penalty or several, comma-separated"),
])
def test_bad_arguments_are_one_line(folders, tmp_path, capsys, extra, message):
    extra = [arg.format(**folders) for arg in extra]
    assert run(finetune.main, arguments(folders, "lookwhere", tmp_path / "run", *extra)) == 2
    error = capsys.readouterr().err.strip()
    assert message in error and "\n" not in error
    assert not (tmp_path / "run").exists()


def test_an_existing_output_folder_is_refused_without_overwrite(folders, tmp_path, capsys):
    argv = arguments(folders, "veca", tmp_path / "run", "--epochs", "0")
    finetune.main(argv)
    capsys.readouterr()
    assert run(finetune.main, argv) == 2
    error = capsys.readouterr().err.strip()
    assert "already holds a run of training.finetune" in error and "--overwrite" in error and "\n" not in error
    assert "--resume" not in error  # finetune has none
    assert finetune.main([*argv, "--overwrite"])["best_epoch"] == 0


def test_evaluate_final_scores_the_last_epoch_held_out_instead_of_best(folders, tmp_path, capsys):
    from experiments.finetune_rotation.finetune_rotation import run_result

    result = finetune.main(arguments(folders, "lookwhere", tmp_path / "run", "--epochs", "1", "--evaluate", "final"))
    out = capsys.readouterr().out
    assert result["evaluated"] == "final" and "held-out accuracy of final/ (epoch 1) on" in out
    assert (tmp_path / "run" / "final" / "heldout.json").is_file()
    assert not (tmp_path / "run" / "best" / "heldout.json").exists()  # measured once, on the folder named in advance
    examples = finetune.labelled_files(folders["heldout"], train=False)[0]
    reloaded = AutoModelForImageClassification.from_pretrained(tmp_path / "run" / "final", trust_remote_code=True)
    with torch.no_grad():
        pixels = torch.stack([load_image(path, 32) for path, _ in examples])
        logits = reloaded.eval()(pixels, k_ratio=0.5).logits
    accuracy = (logits.argmax(-1) == torch.tensor([label for _, label in examples])).float().mean().item()
    assert result["heldout"]["accuracy"] == pytest.approx(accuracy)
    assert f"**{accuracy:.4f}**" in (tmp_path / "run" / "final" / "README.md").read_text()
    assert "- held-out accuracy: see final/" in (tmp_path / "run" / "best" / "README.md").read_text()
    # the benchmark reads such a run, checking its final/ against the recorded score
    assert run_result(str(tmp_path / "run"), 1, "final")["heldout_accuracy"] == pytest.approx(accuracy)


def test_evaluate_needs_eval_data(folders, tmp_path, capsys):
    argv = [folders["lookwhere"], "--data", folders["train"], "--output-dir", str(tmp_path / "run"), "--evaluate",
            "final"]
    assert run(finetune.main, argv) == 2
    error = capsys.readouterr().err.strip()
    assert "--evaluate final names the folder --eval-data scores: give --eval-data too." in error
    assert "\n" not in error and not (tmp_path / "run").exists()


def photo_crops(photos: int, crops: int) -> list[tuple[str, int]]:
    """The rotation task's layout: every crop of every photo in both class folders, under the same file name."""
    return [(f"{name}/photo{photo}_{crop}.png", label) for label, name in enumerate(("upright", "upside_down"))
            for photo in range(photos) for crop in range(crops)]


def test_grouped_validation_split_keeps_each_photo_on_one_side_and_is_seeded():
    examples = photo_crops(photos=12, crops=4)
    groups = finetune.source_groups(examples, r"(.+)_\d+$")
    assert len(set(groups)) == 12  # the twins in upright/ and upside_down/ are one group
    source = dict(zip(examples, groups))
    train, validation = labelled_folders.split_validation(examples, 0.25, 0, groups)
    assert {source[example] for example in train}.isdisjoint({source[example] for example in validation})
    assert sorted(train + validation) == sorted(examples)
    assert len(validation) == 24  # 3 of 12 photos, 8 images each
    assert {label for _, label in validation} == {label for _, label in train} == {0, 1}
    assert (train, validation) == labelled_folders.split_validation(examples, 0.25, 0, groups)
    assert set(validation) != set(labelled_folders.split_validation(examples, 0.25, 1, groups)[1])
    ungrouped = labelled_folders.split_validation(examples, 0.25, 0)[1]  # per class: twins and crops of a photo split up
    assert {source[example] for example in ungrouped} & {source[example] for example in set(examples) - set(ungrouped)}


def test_grouped_validation_split_refuses_a_class_left_on_one_side():
    examples = photo_crops(photos=1, crops=4)  # one photo: it is either all validation or all training
    with pytest.raises(ValueError, match="Class 0 has no training image once the 1 --val-groups groups are kept whole"):
        labelled_folders.split_validation(examples, 0.2, 0, finetune.source_groups(examples, r"(.+)_\d+$"))
    with pytest.raises(ValueError, match=r"--val-groups '\^x' does not match photo0_0.png"):
        finetune.source_groups(examples, "^x")


def test_val_groups_is_recorded_in_run_json_and_the_card(folders, tmp_path, capsys):
    finetune.main(arguments(folders, "veca", tmp_path / "run", "--epochs", "0", "--val-groups", r"^\d"))
    assert r"validation: 4 of 20 images, 2 of 10 groups by --val-groups '^\d'" in capsys.readouterr().out
    assert json.loads((tmp_path / "run" / "run.json").read_text())["args"]["val_groups"] == r"^\d"
    assert r"whole groups by --val-groups `^\d`" in (tmp_path / "run" / "best" / "README.md").read_text()


def test_random_crops_sample_the_drawn_square_of_a_ramp():
    """On an image whose value is its x (or y) coordinate, a bilinear crop of side s centred at c gives s x + c at
    each output pixel, clamped to the image's outer pixel centres (border padding): the draws replayed by hand."""
    size = 16
    centres = (torch.arange(size) + 0.5) / size * 2 - 1  # align_corners=False: pixel centres in (-1, 1)
    ramps = torch.stack([centres.expand(size, size), centres[:, None].expand(size, size)])  # x, then y
    images = ramps.expand(5, 2, size, size).contiguous()
    torch.manual_seed(3)
    cropped = finetune_augment.random_crops(images, 0.3, 0.8)
    torch.manual_seed(3)
    side = 0.3 + 0.5 * torch.rand(5)
    centre = (1 - side)[:, None] * (2 * torch.rand(5, 2) - 1)
    for axis, grid in ((0, centres[None, None, :]), (1, centres[None, :, None])):
        expected = (side[:, None, None] * grid + centre[:, axis, None, None]).clamp(centres[0], centres[-1])
        torch.testing.assert_close(cropped[:, axis], expected.expand(5, size, size), atol=1e-5, rtol=0)
    assert (side < 0.8).all() and (side > 0.3).all() and (centre.abs() <= 1 - side[:, None]).all()
    torch.testing.assert_close(finetune_augment.random_crops(images, 1.0, 1.0), images, atol=1e-6, rtol=0)  # side 1: as is


def test_random_grayscale_is_pils_luma_on_the_drawn_images():
    """A made-grey image equals the processor's pixels of PIL's convert("L") copy (to PIL's rounding to 8 bits, half a
    level over the smallest ImageNet std); the others are untouched, as the replayed draws say."""
    rng = np.random.default_rng(0)
    photos = [Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)) for _ in range(6)]
    colour = torch.stack([to_pixel_values(photo) for photo in photos])
    grey = torch.stack([to_pixel_values(photo.convert("L").convert("RGB")) for photo in photos])
    torch.manual_seed(5)
    made = finetune_augment.random_grayscale(colour, 0.5)
    torch.manual_seed(5)
    chosen = torch.rand(6) < 0.5
    assert 0 < chosen.sum() < 6
    torch.testing.assert_close(made[chosen], grey[chosen], atol=0.5 / 255 / 0.224 + 1e-5, rtol=0)
    assert torch.equal(made[~chosen], colour[~chosen])
    assert (made[chosen] - colour[chosen]).abs().max() > 0.5  # the colour really went
    assert torch.equal(finetune_augment.random_grayscale(colour, 0.0), colour)


def test_several_probe_penalties_keep_the_best_on_validation():
    """choose_probe folds in the probe whose validation accuracy is highest, as fitting each one alone shows."""
    from corevision_hf import VecaForImageClassification

    torch.manual_seed(0)
    signal = torch.randn(64, 128)
    labels = (signal[:, 0] + 0.8 * torch.randn(64) > 0).long()  # a noisy rule: heavy penalties help
    features = {"train": (signal[:32], labels[:32]), "validation": (signal[32:], labels[32:])}
    model = VecaForImageClassification(tiny_veca_config(num_labels=2))
    penalties = [1e-4, 1e-1, 10.0]
    chosen = head_probe.choose_probe(model, *features["train"], *features["validation"], penalties)
    accuracy = {}
    for penalty in penalties:
        probe = fit_linear_classifier(*features["train"], 2, penalty, per_feature=False)
        accuracy[penalty] = (probe(signal[32:]).argmax(-1) == labels[32:]).float().mean().item()
    assert chosen["validation"] == accuracy and len(set(accuracy.values())) > 1
    assert chosen["weight_decay"] == max(penalties, key=lambda penalty: (accuracy[penalty], penalty))
    probe = fit_linear_classifier(*features["train"], 2, chosen["weight_decay"], per_feature=False)
    torch.testing.assert_close(model.classifier(signal), probe(signal), rtol=1e-4, atol=1e-4)


def test_probe_penalty_choice_and_crops_are_printed_and_carded(folders, tmp_path, capsys):
    finetune.main(arguments(folders, "veca", tmp_path / "run", "--epochs", "1", "--probe-weight-decay", "1e-2,1",
                            "--crop-scale", "0.5:1", "--grayscale", "0.2"))
    out = capsys.readouterr().out
    # bright and dark: both probes are right on every validation image; the weaker penalty's surer logits have the
    # lower validation loss, which breaks the tie
    assert "probe penalty (--probe-weight-decay) chosen on validation: 0.01 (kept): 1.0000, 1: 1.0000\n" in out
    card = (tmp_path / "run" / "best" / "README.md").read_text()
    assert "L2 penalty 0.01, folded" in card
    assert ("Augmentations of the training images: left-right flips of half the images (--no-hflip where a mirror "
            "image changes the label: orientation, handedness, text); square crops of 0.5 to 1 of the side") in card
    assert "grey with probability 0.2 (--grayscale 0 where the colour is the label)." in card
    first = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["epoch"] == 0 and first["probe_weight_decay"] == 0.01


def test_the_new_head_is_one_line_and_other_missing_weights_a_warning(folders, tmp_path, capsys, caplog):
    finetune.main(arguments(folders, "veca", tmp_path / "run", "--epochs", "0"))
    out = capsys.readouterr().out
    assert "a new head for the 2 classes (bright, dark): the linear probe fits it next\n" in out
    assert "warning" not in out and "LOAD REPORT" not in caplog.text + out
    import shutil

    from safetensors.torch import save_file
    shutil.copytree(folders["veca"], tmp_path / "lacking")
    weights = load_file(tmp_path / "lacking" / "model.safetensors")
    del weights["encoder.layers.1.mlp.fc2.bias"]
    save_file(weights, tmp_path / "lacking" / "model.safetensors", metadata={"format": "pt"})
    argv = arguments(folders, "veca", tmp_path / "run2", "--epochs", "0")
    finetune.main([str(tmp_path / "lacking"), *argv[1:]])
    assert (f"warning: 1 weights missing in {tmp_path / 'lacking'} (newly initialised or ignored), e.g. "
            "veca.encoder.layers.1.mlp.fc2.bias: is it a veca checkpoint of this version?") in capsys.readouterr().out


def test_wise_ft_mixes_the_last_epoch_with_the_probe_and_a_mix_can_be_best(folders, tmp_path, monkeypatch, capsys):
    """Each --wise-ft mix is (1 - a) probe + a final, the probe being an --epochs 0 run's best/ and the last epoch
    this run's final/: its metrics line is that mix's validation score, and a mix that scores best is best/ (the
    evaluation is made to favour the 0.5 mix, as on a task where it keeps best)."""
    finetune.main(arguments(folders, "lookwhere", tmp_path / "probe", "--epochs", "0"))
    mixes, real_mix, real_evaluate = [], finetune.mix_weights, finetune.evaluate

    def mix_and_note(model, probe, fine_tuned, mix):
        mixes.append(mix)
        real_mix(model, probe, fine_tuned, mix)

    def evaluate_favouring_the_half_mix(*args, **kwargs):
        result = real_evaluate(*args, **kwargs)
        return {**result, "accuracy": 2.0} if mixes[-1:] == [0.5] else result

    monkeypatch.setattr(finetune, "mix_weights", mix_and_note)
    monkeypatch.setattr(finetune, "evaluate", evaluate_favouring_the_half_mix)
    result = finetune.main(arguments(folders, "lookwhere", tmp_path / "run", "--epochs", "1", "--wise-ft", "0.25,0.5"))
    assert mixes == [0.25, 0.5] and result["wise_ft"] == 0.5 and result["best_epoch"] == 1
    probe = load_file(tmp_path / "probe" / "best" / "model.safetensors")
    final = load_file(tmp_path / "run" / "final" / "model.safetensors")
    best = load_file(tmp_path / "run" / "best" / "model.safetensors")
    assert any(not torch.equal(probe[name], final[name]) for name in final)  # the epoch moved the weights
    for name in final:
        torch.testing.assert_close(best[name], torch.lerp(probe[name], final[name], 0.5), rtol=0, atol=1e-7)
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(line["epoch"], line.get("wise_ft")) for line in lines] == [(0, None), (1, None), (1, 0.25), (1, 0.5)]
    # the 0.25 line is the validation score of that mix, loaded into a fresh model and evaluated here
    model = AutoModelForImageClassification.from_pretrained(tmp_path / "run" / "final")
    model.load_state_dict({name: torch.lerp(probe[name], final[name], 0.25) for name in final}, strict=False)
    train, validation = labelled_folders.split_validation(finetune.labelled_files(folders["train"], True)[0], 0.2, 0)
    batches = finetune.loader(validation, 32, 4, 0)
    assert real_evaluate(model, batches, {"k_ratio": 0.5}, "cpu")["loss"] == pytest.approx(
        lines[2]["validation"]["loss"], rel=1e-5)
    assert json.loads((tmp_path / "run" / "best" / "validation.json").read_text())["wise_ft"] == 0.5
    assert "0.5 probe + 0.5 fine-tuned (WiSE-FT)" in (tmp_path / "run" / "best" / "README.md").read_text()
    out = capsys.readouterr().out
    assert "WiSE-FT 0.25 (epoch 1's weights mixed with the probe's, 0.75 : 0.25): validation accuracy" in out
    assert "held-out accuracy of best/ (epoch 1, WiSE-FT 0.5) on" in out
