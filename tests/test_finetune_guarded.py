"""The fine-tuning recipe that never loses to its own probe (issue #69): the probe fitted on the inputs fine-tuning trains
on (--probe-views), best/ chosen by the paired rule (training.final_choice, --choose paired), the recipe's probe
baseline (--recipe finetune-guarded --epochs 0), the paired comparison as a command (training.compare_finetuned) and
benchmarks/finetune_tasks.py. Tiny random models, a few generated images."""

import json

import pytest
import torch
from safetensors.torch import load_file
from test_finetune import arguments, folders  # noqa: F401  (folders: the module's fixture)

from corevision_hf.cli import run
from evaluation.paired_stats import bootstrap_rows, group_draws, grouped_interval, interval
from training import compare_finetuned, final_choice, finetune


def candidates(probe: list[int], **others: list[int]) -> list[dict]:
    """The probe and `others` ({name: 0/1 per validation image}) as training.final_choice takes them."""
    rows = [{"name": "probe", "epoch": 0, "wise_ft": None, "correct": torch.tensor(probe, dtype=torch.bool)}]
    return rows + [{"name": name, "epoch": 1, "wise_ft": None, "correct": torch.tensor(right, dtype=torch.bool)}
                   for name, right in others.items()]


def weights(folder) -> dict:
    return load_file(f"{folder}/model.safetensors")


# the rule


def test_a_candidate_is_kept_only_when_it_beats_the_probe_beyond_the_noise():
    photos = [f"photo{index}" for index in range(20) for _ in range(2)]  # 20 photos, 2 crops each
    probe = [0, 1] * 20
    clear = [1, 1] * 10 + [0, 1] * 10  # right on both crops of 10 photos where the probe gets one
    noisy = [1, 1] * 3 + [0, 0] * 2 + [0, 1] * 15  # 3 photos better, 2 worse
    choice = final_choice.choose(candidates(probe, clear=clear), photos, seed=0)
    assert choice["kept"] == "clear" and choice["candidates"][1]["minus_probe"]["low"] > 0
    assert choice["candidates"][1]["minus_probe"]["mean"] == pytest.approx(0.25)
    choice = final_choice.choose(candidates(probe, noisy=noisy), photos, seed=0)
    assert choice["candidates"][1]["validation_accuracy"] > choice["candidates"][0]["validation_accuracy"]
    assert choice["kept"] == "probe" and choice["candidates"][1]["minus_probe"]["low"] <= 0
    assert choice["why"].startswith("no candidate beats the probe on validation beyond the noise of 20 groups")
    never_worse = [1, 1] * 2 + [0, 1] * 18  # better on 2 photos of 20, worse on none: a resample often has neither
    choice = final_choice.choose(candidates(probe, never_worse=never_worse), photos, seed=0)
    assert choice["candidates"][1]["minus_probe"]["low"] == 0 and choice["kept"] == "probe"


def test_the_crops_of_one_photo_count_once():
    """One photo of 30 crops that the candidate gets right and the probe wrong, 12 photos where both agree: image by
    image that is a clear lead, photo by photo one photo, which a resample often leaves out."""
    photos = ["big"] * 30 + [f"photo{index}" for index in range(12)]
    probe, candidate = [0] * 30 + [1, 0] * 6, [1] * 30 + [1, 0] * 6
    by_photo = final_choice.choose(candidates(probe, epoch=candidate), photos, seed=0)
    by_image = final_choice.choose(candidates(probe, epoch=candidate), list(range(42)), seed=0)
    assert by_photo["kept"] == "probe" and by_photo["groups"] == 13
    assert by_image["kept"] == "epoch" and by_image["groups"] == 42


def test_fewer_validation_groups_than_the_rule_needs_keep_the_probe():
    for count, kept in ((final_choice.MIN_GROUPS - 1, "probe"), (final_choice.MIN_GROUPS, "perfect")):
        choice = final_choice.choose(candidates([0] * count, perfect=[1] * count), list(range(count)), seed=0)
        assert choice["kept"] == kept, count
    assert "fewer than the 10 a paired choice needs" in final_choice.choose(
        candidates([0] * 9, perfect=[1] * 9), list(range(9)), seed=0)["why"]


def test_of_candidates_that_qualify_the_most_accurate_then_the_nearest_the_probe_is_kept():
    probe = [0] * 20
    choice = final_choice.choose(candidates(probe, near=[1] * 15 + [0] * 5, far=[1] * 15 + [0] * 5,
                                            best=[1] * 18 + [0] * 2), list(range(20)), seed=0)
    assert choice["kept"] == "best"
    choice = final_choice.choose(candidates(probe, near=[1] * 15 + [0] * 5, far=[1] * 15 + [0] * 5),
                                 list(range(20)), seed=0)
    assert choice["kept"] == "near"


def test_a_grouped_interval_of_single_examples_is_the_plain_bootstrap():
    values = torch.tensor([1.0, 0, 1, 1, 0, 1, 0, 1, 1, 1])
    assert grouped_interval(values, *group_draws(list(range(10)), 300, seed=4)) == interval(
        values, bootstrap_rows(10, 300, seed=4))


# the command


def test_the_recipes_probe_baseline_runs_with_epochs_0(folders, tmp_path, capsys):
    """--recipe finetune-guarded --epochs 0: the recipe's --wise-ft gives way, best/ and final/ are the probe; a --wise-ft
    of the command line with --epochs 0 is still refused, and --wise-ft none unsets one."""
    result = finetune.main(arguments(folders, "lookwhere", tmp_path / "probe", "--recipe", "finetune-guarded",
                                     "--epochs", "0", "--image-size", "32"))
    out = capsys.readouterr().out
    assert "--epochs 0: the recipe's --wise-ft 0.25,0.5,0.75 gives way" in out
    assert json.loads((tmp_path / "probe" / "run.json").read_text())["args"]["wise_ft"] == "none"
    assert result["best_epoch"] == 0 and json.loads((tmp_path / "probe" / "choice.json").read_text())["kept"] == "probe"
    best, final = weights(tmp_path / "probe" / "best"), weights(tmp_path / "probe" / "final")
    assert best.keys() == final.keys() and all(torch.equal(best[name], final[name]) for name in best)
    finetune.main(arguments(folders, "lookwhere", tmp_path / "final", "--recipe", "finetune-final", "--epochs", "0",
                            "--image-size", "32"))
    argv = arguments(folders, "veca", tmp_path / "mixed", "--epochs", "0", "--wise-ft", "0.5")
    assert run(finetune.main, argv) == 2
    assert "give --epochs 1 or more, or --wise-ft none" in capsys.readouterr().err
    assert finetune.main([*argv[:-1], "none"])["best_epoch"] == 0


def test_the_probe_of_epochs_0_is_the_probe_fine_tuning_starts_from(folders, tmp_path, capsys):
    """With --probe-views the probe reads augmented views of the training images too, drawn from the seed, the view and
    the batch alone: an --epochs 0 run fits the very probe that an --epochs 2 run starts from."""
    common = ["--probe-views", "2", "--crop-scale", "0.5:1", "--choose", "paired"]
    finetune.main(arguments(folders, "lookwhere", tmp_path / "probe", "--epochs", "0", *common))
    assert "linear probe, training view 2/2: 16 images read (4/4 batches)" in capsys.readouterr().out
    finetune.main(arguments(folders, "lookwhere", tmp_path / "tuned", "--epochs", "2", *common))
    finetune.main(arguments(folders, "lookwhere", tmp_path / "plain", "--epochs", "0", *common[2:]))
    first = {run: (tmp_path / run / "metrics.jsonl").read_text().splitlines()[0] for run in ("probe", "tuned", "plain")}
    assert first["probe"] == first["tuned"] != first["plain"]
    probe, plain = weights(tmp_path / "probe" / "best"), weights(tmp_path / "plain" / "best")
    assert not torch.equal(probe["classifier.weight"], plain["classifier.weight"])  # the views moved the probe


def test_the_probes_views_are_the_training_inputs_drawn_anew(folders):
    """probe_features: the training images as they are (at the evaluation budget), then each view; with crops and
    flips each view differs from the images and from the other; with neither, and the training budget the evaluation's,
    a view is the images again."""
    from argparse import Namespace

    from corevision_hf import LookWhereForImageClassification
    from training.head_probe import head_features
    from training.labelled_folders import labelled_files, loader

    torch.manual_seed(0)
    model = LookWhereForImageClassification.from_pretrained(folders["lookwhere"], num_labels=2)
    batches = loader(labelled_files(folders["train"], train=True)[0], 32, 4, 0)
    run = {"model": model, "fixed": batches, "device": "cpu", "eval_budget": {"k_ratio": 0.5},
           "draw_budget": lambda step: {"k_ratio": 0.5}}
    plain = head_features(model, batches, {"k_ratio": 0.5}, "cpu")[0]
    augmented = Namespace(probe_views=2, crop_scale="0.5:1", hflip=True, grayscale=0.0, seed=0)
    features, labels = finetune.probe_features({**run, "args": augmented})
    assert features.shape == (60, plain.shape[1]) and torch.equal(labels[:20], labels[20:40])
    assert torch.equal(features[:20], plain)
    assert not torch.allclose(features[20:40], plain) and not torch.allclose(features[20:40], features[40:])
    as_they_are = Namespace(probe_views=1, crop_scale="1", hflip=False, grayscale=0.0, seed=0)
    features = finetune.probe_features({**run, "args": as_they_are})[0]
    torch.testing.assert_close(features[20:], plain)


@pytest.mark.parametrize("kept", ["probe", "WiSE-FT 0.5", "epoch 1"])
def test_best_is_the_candidate_the_rule_keeps_and_the_run_says_why(folders, tmp_path, monkeypatch, capsys, kept):
    finetune.main(arguments(folders, "lookwhere", tmp_path / "probe", "--epochs", "0", "--choose", "paired"))
    real_choose = final_choice.choose

    def choose_as_told(rows, groups, seed):
        return {**real_choose(rows, groups, seed), "kept": kept, "why": "told so"}

    if kept != "probe":  # the probe: the real rule, which 4 validation images leave at the probe
        monkeypatch.setattr(final_choice, "choose", choose_as_told)
    argv = arguments(folders, "lookwhere", tmp_path / "run", "--epochs", "1", "--wise-ft", "0.25,0.5,0.75",
                     "--choose", "paired")
    result = finetune.main(argv)
    out = capsys.readouterr().out
    choice = json.loads((tmp_path / "run" / "choice.json").read_text())
    assert [row["name"] for row in choice["candidates"]] == ["probe", "WiSE-FT 0.25", "WiSE-FT 0.5", "WiSE-FT 0.75",
                                                            "epoch 1"]
    assert "minus_probe" in choice["candidates"][4] and choice["kept"] == kept
    best, final, probe = (weights(tmp_path / folder) for folder in ("run/best", "run/final", "probe/best"))
    expected = {"probe": probe, "epoch 1": final,
                "WiSE-FT 0.5": {name: torch.lerp(probe[name], final[name], 0.5) for name in final}}[kept]
    for name in final:
        torch.testing.assert_close(best[name], expected[name], rtol=0, atol=1e-7)
    validation = json.loads((tmp_path / "run" / "best" / "validation.json").read_text())
    assert validation["chosen_by"] == choice["why"] == result["validation"]["chosen_by"]
    assert f"- kept by --choose paired: {choice['why']}" in (tmp_path / "run" / "best" / "README.md").read_text()
    assert f"best/ (--choose paired) keeps {'the probe' if kept == 'probe' else kept}: {choice['why']}" in out
    if kept == "probe":
        assert "fewer than the 10 a paired choice needs" in choice["why"]
        assert finetune.main([*argv, "--overwrite"])["best_epoch"] == 0  # choice.json is the run's own


def test_val_groups_group_the_validation_folder(folders, tmp_path, capsys):
    finetune.main(arguments(folders, "veca", tmp_path / "run", "--epochs", "0", "--val-data", folders["val"],
                            "--val-groups", r"(\d)", "--choose", "paired"))
    assert "validation: 10 images, 5 groups by --val-groups '(\\d)'" in capsys.readouterr().out
    assert json.loads((tmp_path / "run" / "choice.json").read_text())["groups"] == 5


# the comparison command


def test_compare_prints_both_accuracies_and_the_paired_interval_by_photo(folders, tmp_path, capsys):
    for name, epochs in (("tuned", "2"), ("probe", "0")):
        finetune.main(arguments(folders, "lookwhere", tmp_path / name, "--epochs", epochs))
    capsys.readouterr()
    first, second = str(tmp_path / "tuned" / "final"), str(tmp_path / "probe" / "best")
    result = compare_finetuned.main([first, second, "--data", folders["heldout"], "--groups", r"(\d)", "--output",
                                     str(tmp_path / "compare.json")])
    out = capsys.readouterr().out
    heldout = json.loads((tmp_path / "probe" / "best" / "heldout.json").read_text())["accuracy"]
    assert result["second"]["accuracy"] == pytest.approx(heldout)  # at the run's size and budget, as it scored
    assert f"second {second}: accuracy {heldout:.4f} (6 images)" in out
    groups = [path.rsplit("/", 1)[1][0] for path in result["files"]]  # 0.png ... 2.png in both class folders
    expected = compare_finetuned.paired_difference(result["first"]["correct"], result["second"]["correct"], groups,
                                                   2000, 0)
    assert result["difference"] == expected and result["group_count"] == 3
    difference = result["difference"]
    assert (f"first - second: {difference['mean']:+.4f} [{difference['low']:+.4f}, {difference['high']:+.4f}] (95% "
            "paired bootstrap over 3 groups by --groups '(\\d)', 2000 resamples)") in out
    assert json.loads((tmp_path / "compare.json").read_text())["first"]["correct"] == result["first"]["correct"]
    same = compare_finetuned.main([second, second, "--data", folders["heldout"]])["difference"]
    assert (same["mean"], same["low"], same["high"]) == (0.0, 0.0, 0.0)


def test_compare_answers_bad_input_in_one_line(folders, tmp_path, capsys):
    finetune.main(arguments(folders, "veca", tmp_path / "run", "--epochs", "0"))
    best = str(tmp_path / "run" / "best")
    (tmp_path / "other" / "a").mkdir(parents=True)
    (tmp_path / "other" / "b").mkdir()
    for cls in ("a", "b"):
        (tmp_path / "other" / cls / "x.png").write_bytes(open(f"{folders['heldout']}/dark/0.png", "rb").read())
    (tmp_path / "taken.json").write_text("{}")
    for argv, words in (([best, str(tmp_path / "missing"), "--data", folders["heldout"]], "is no classifier folder"),
                        ([best, best, "--data", str(tmp_path / "nothing")], "is no folder"),
                        ([best, best, "--data", str(tmp_path / "other")], "predicts the classes"),
                        ([best, best, "--data", folders["heldout"], "--groups", "(x"], "is no regular expression"),
                        ([best, best, "--data", folders["heldout"], "--groups", "z"], "does not match"),
                        ([best, best, "--data", folders["heldout"], "--output", str(tmp_path / "taken.json")],
                         "exists: give a new file")):
        capsys.readouterr()
        assert run(compare_finetuned.main, argv) == 2
        lines = capsys.readouterr().err.strip().splitlines()  # before the error: progress bars at most
        assert lines[-1].startswith("error: ") and words in lines[-1], lines
        assert not any(line.startswith(("error", "Traceback")) for line in lines[:-1]), lines
