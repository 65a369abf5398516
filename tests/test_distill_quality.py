"""The arithmetic of benchmarks/distill_quality.py, checked by hand: its standard errors, its goals and its guards.
(The benchmark itself trains nine students for an hour; these run in a second.)"""

import json
import math
import shlex

import pytest

from benchmarks import distill_quality as dq


def test_standard_error_adds_the_photo_and_the_seed_terms():
    # seeds x photos; per-photo means 2, 3, 4 (variance 1), per-seed means 2, 4 (variance 2)
    mean, error = dq.mean_and_error([[1.0, 2.0, 3.0], [3.0, 4.0, 5.0]])
    assert mean == pytest.approx(3.0)
    assert error == pytest.approx(math.sqrt(1 / 3 + 2 / 2))


def test_standard_error_with_one_seed_is_the_spread_over_photos():
    mean, error = dq.mean_and_error([[1.0, 2.0, 3.0]])
    assert (mean, error) == pytest.approx((2.0, math.sqrt(1 / 3)))
    assert dq.mean_and_error([[0.7]]) == (0.7, None)


def test_accuracy_error_is_binomial_plus_seed_spread():
    mean, error = dq.accuracy_and_error([0.5, 0.7], images=100)
    assert mean == pytest.approx(0.6)
    assert error == pytest.approx(math.sqrt(0.6 * 0.4 / 100 + 0.02 / 2))
    assert dq.accuracy_and_error([0.9, 0.9, 0.9], images=50)[1] == pytest.approx(math.sqrt(0.9 * 0.1 / 50))


def test_paired_ratio_error_by_hand():
    # A - 1.05 B = [[-0.15, 0.05], [-0.05, 0.15]]: photo means -0.1, 0.1 (variance 0.02), seed means -0.05, 0.05
    # (variance 0.005); over mean(B) = 1
    ratio, error = dq.paired_ratio([[0.9, 1.1], [1.0, 1.2]], [[1.0, 1.0], [1.0, 1.0]])
    assert ratio == pytest.approx(1.05)
    assert error == pytest.approx(math.sqrt(0.02 / 2 + 0.005 / 2))


def test_paired_ratio_cancels_what_both_share():
    # hard and easy photos, a good and a bad seed, but A is always 0.9 B: the ratio is known exactly
    reference = [[0.3, 0.9, 0.6], [0.5, 0.8, 0.4]]
    ratio, error = dq.paired_ratio([[0.9 * b for b in row] for row in reference], reference)
    assert ratio == pytest.approx(0.9)
    assert error == pytest.approx(0.0, abs=1e-12)
    assert dq.mean_and_error(reference)[1] > 0.1  # while each mean on its own is uncertain


def test_goals_compare_the_right_rows():
    def entry(cls, patch):  # two seeds x two photos, spread around the given means
        return {"cls": [[cls - 0.01, cls + 0.01], [cls, cls]], "patch": [[patch - 0.01, patch + 0.01], [patch, patch]]}

    agreements = {
        ("VECA-S", "cores=4", 224): entry(0.60, 0.40),
        ("VECA-S", "cores=32", 224): entry(0.62, 0.50),
        ("dense ViT-S", "all", 224): entry(0.70, 0.51),
        ("LookWhere-S", "k_ratio=0.1", 224): entry(0.56, 0.30),
    }
    goals = dq.goal_rows(agreements, 224, smallest=4, largest=32)
    assert [round(g["ratio"], 4) for g in goals] == [round(0.60 / 0.62, 4), 0.8, round(0.50 / 0.51, 4), 0.8]
    assert [g["met"] for g in goals] == [True, False, True, False]
    assert [g["target"] for g in goals] == [0.96, 0.96, 0.97, 0.90]
    assert [g["value"] for g in goals] == pytest.approx([0.60, 0.40, 0.50, 0.56])
    first = goals[0]
    assert first["ratio_se"] == pytest.approx(dq.paired_ratio(agreements["VECA-S", "cores=4", 224]["cls"],
                                                              agreements["VECA-S", "cores=32", 224]["cls"])[1])


def test_the_recipe_command_parses_back_to_the_same_training():
    args = dq.parse_args(["--seeds", "0", "1", "--steps", "7", "--lr", "3e-4", "--k-max", "64", "--copies", "2"])
    again = dq.parse_args(shlex.split(dq.reproducing_command(args, 1))[3:])
    assert again.seeds == [1]
    assert {name: getattr(again, name) for name in dq.TRAINING_SETTINGS} == {
        name: getattr(args, name) for name in dq.TRAINING_SETTINGS}


@pytest.mark.parametrize("argv, words", [
    (["--resolutions", "230"], "not a positive multiple of the patch size 14; use e.g. 224"),
    (["--k-max", "300"], "--k-max <= 256"),
    (["--seeds", "1", "1"], "repeats a seed"),
])
def test_bad_arguments_are_one_line(argv, words, capsys):
    with pytest.raises(SystemExit) as stop:
        dq.parse_args(argv)
    assert stop.value.code == 2
    assert words in capsys.readouterr().err


def test_scratch_folder_is_refused_unless_the_benchmark_made_it(tmp_path):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(SystemExit, match="was not made by this benchmark"):
        dq.scratch_folder(dq.parse_args(["--scratch-dir", str(foreign)]))
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_scratch_folder_keeps_students_only_for_the_same_settings(tmp_path):
    scratch = tmp_path / "scratch"
    args = dq.parse_args(["--scratch-dir", str(scratch)])
    dq.scratch_folder(args)
    (scratch / "seed0").mkdir()
    dq.scratch_folder(args)
    assert (scratch / "seed0").exists()  # same settings: the saved students are reused
    dq.scratch_folder(dq.parse_args(["--scratch-dir", str(scratch), "--steps", "3"]))
    assert not (scratch / "seed0").exists()
    assert json.loads((scratch / ".distill-quality.json").read_text())["steps"] == 3
