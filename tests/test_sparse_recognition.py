"""benchmarks.sparse_recognition: its presets, its goals by the one rule, its smoke mode end to end, and its one-line
errors (the library jobs it reads have their own tests: test_selections, test_paired_stats, test_readers,
test_teacher_passes, test_task_student, test_finetune_protocol)."""

import errno
import json
import tempfile
from pathlib import Path

import pytest
import torch
from conftest import save_extra_photos, save_task_teacher, tiny_veca_config
from transformers import Dinov2Config, Dinov2Model

from benchmarks import sparse_recognition as sr
from corevision_hf import lookwhere_from_teacher
from corevision_hf.cli import run
from corevision_hf.lookwhere.budget_lookwhere import kept_for_ratio
from evaluation.canvases import task_splits
from evaluation.lookwhere_features import selector_maps_of
from evaluation.lookwhere_lines import line_name
from evaluation.selections import coverage, top_cells
from evaluation.task_lines import DENSE, EQUAL
from evaluation.task_student import load_photo_student
from publishing.model_card import read_task_table

ROOT = Path(__file__).resolve().parents[1]


def test_an_option_given_wins_over_the_preset_even_at_its_default():
    assert sr.parse_args(["--smoke"]).steps == sr.SMOKE["steps"] != sr.parse_args([]).steps
    assert sr.parse_args(["--smoke", "--steps", str(sr.parse_args([]).steps)]).steps == sr.parse_args([]).steps
    assert sr.parse_args(["--smoke", "--batch-size", "8"]).batch_size == 8 != sr.SMOKE["batch_size"]


def entry(mean: float, low: float, high: float) -> dict:
    return {"mean": mean, "low": low, "high": high, "half_width": (high - low) / 2}


def report_with(gap: dict, lookwhere_minus_dense: dict, selector_minus_random: dict, dense: dict) -> dict:
    lookwhere = line_name("LookWhere-S", 0.1, "selector")
    comparisons = {"teacher dense - teacher at equal FLOPs (best readers)": gap,
                   "coverage: selector / random": {"ratio": 4.0, "low": 3.2, "high": 5.0},
                   "coverage: teacher's cls map / random": {"ratio": 4.0, "low": 3.0, "high": 5.0},
                   "coverage: selector / teacher's cls map": {"ratio": 1.0, "low": 0.85, "high": 1.1},
                   "attentive: selector - random": selector_minus_random,
                   "fine-tuned: selector - random": selector_minus_random,
                   "selector (attentive) - teacher dense (best reader)": lookwhere_minus_dense,
                   "selector (attentive) - teacher at equal FLOPs (best reader)": entry(0.2, 0.1, 0.3),
                   "fine-tuned: selector - teacher dense": lookwhere_minus_dense}
    probe = {DENSE: {"accuracy": dense}, lookwhere: {"readers": {"attentive": {"accuracy": entry(0.5, 0.4, 0.6)}}}}
    return {"variants": {"single": {"comparisons": comparisons, "probe": probe,
                                    "fine_tuned": {DENSE: {"accuracy": dense}}}}}


def test_goals_are_met_or_missed_by_one_rule_an_interval_against_a_margin_and_a_reference_above_chance():
    costs = {"dense": 100.0, 0.1: 8.0}
    report = report_with(entry(0.3, 0.15, 0.45), entry(-0.02, -0.04, 0.0), entry(0.2, 0.05, 0.35),
                         entry(0.6, 0.5, 0.7))
    decided = sr.goals(report, costs, "cls")
    met = {g["goal"]: g["met"] for g in decided}
    assert met == {"resolution_matters": True, "coverage_selector_over_random": True,
                   "selector_coverage_vs_teacher_map": False, "accuracy_selector_minus_random": True,
                   "lookwhere_vs_dense_teacher": True, "lookwhere_vs_equal_flops_teacher": True,
                   "lookwhere_vs_dense_teacher_fine_tuned": True}
    # each goal states its interval's half-width, a ratio's too
    assert [g["interval_half_width"] for g in decided] == pytest.approx([0.15, 0.9, 0.125, 0.15, 0.02, 0.1, 0.02])
    # a mean above the margin is not enough: the interval's low end decides
    report = report_with(entry(0.3, 0.08, 0.5), entry(-0.02, -0.06, 0.02), entry(0.2, -0.01, 0.4),
                         entry(0.6, 0.5, 0.7))
    missed = {g["goal"]: g["met"] for g in sr.goals(report, costs, "cls")}
    assert not missed["resolution_matters"] and not missed["lookwhere_vs_dense_teacher"]
    assert not missed["lookwhere_vs_dense_teacher_fine_tuned"]
    assert not missed["accuracy_selector_minus_random"]
    # a dense teacher whose interval reaches chance decides nothing
    report = report_with(entry(0.3, 0.15, 0.45), entry(0.0, -0.01, 0.01), entry(0.2, 0.05, 0.35),
                         entry(0.2, 0.1, 0.3))
    goals = {g["goal"]: g for g in sr.goals(report, costs, "cls")}
    assert not goals["resolution_matters"]["met"] and goals["resolution_matters"]["interval_above_margin"]
    # and fewer than 10x the GFLOPs misses the dense-teacher goal whatever the accuracies
    cheaper = {g["goal"]: g["met"] for g in sr.goals(report_with(
        entry(0.3, 0.15, 0.45), entry(0.0, -0.01, 0.01), entry(0.2, 0.05, 0.35), entry(0.6, 0.5, 0.7)),
        {"dense": 40.0, 0.1: 8.0}, "cls")}
    assert not cheaper["lookwhere_vs_dense_teacher"] and not cheaper["lookwhere_vs_dense_teacher_fine_tuned"]
    # without the fine-tuned lines the fine-tuned goal is missed, not met by default
    report = report_with(entry(0.3, 0.15, 0.45), entry(0.0, -0.01, 0.01), entry(0.2, 0.05, 0.35), entry(0.6, 0.5, 0.7))
    report["variants"]["single"].pop("fine_tuned")
    del report["variants"]["single"]["comparisons"]["fine-tuned: selector - teacher dense"]
    unmeasured = {g["goal"]: g for g in sr.goals(report, costs, "cls")}["lookwhere_vs_dense_teacher_fine_tuned"]
    assert not unmeasured["met"] and unmeasured["interval_half_width"] is None


def test_the_task_card_says_how_the_student_was_made():
    """The card's caption: distilled label-free for its steps, or (0 steps) the teacher's copy beside a selector that
    learnt the map alone for its steps (the committed run's student)."""
    report = json.loads((ROOT / "benchmarks" / "results" / "sparse_recognition.json").read_text())
    assert report["student"]["steps"] == 0
    assert sr.made_how(report) == ("This checkpoint's extractor is the teacher's unchanged copy; its selector learnt "
                                   f"the teacher's map alone for {report['student']['selector_steps']} steps on the "
                                   "task's training canvases (no labels).")
    distilled = {**report, "student": {**report["student"], "steps": 400}}
    assert sr.made_how(distilled) == ("This checkpoint was distilled label-free for 400 steps on the task's training "
                                      "canvases.")
    assert sr.made_how(report) in sr.task_table(report)["caption"]


@pytest.mark.slow
def test_smoke_run_measures_every_line_and_states_every_goal(tmp_path):
    save_task_teacher(tmp_path / "teacher")
    teacher = Dinov2Model.from_pretrained(str(tmp_path / "teacher"))
    lookwhere_from_teacher(teacher, selector_depth=2, selector_image_size=42).save_pretrained(tmp_path / "photos")
    out = tmp_path / "out"
    common = ["--smoke", "--teacher", str(tmp_path / "teacher"), "--threads", "1", "--photo-student",
              str(tmp_path / "photos"), "--cache-dir", str(tmp_path / "cache")]
    report = sr.main([*common, "--out-dir", str(out), "--scratch-dir", str(tmp_path / "scratch")])
    assert json.loads((out / "sparse_recognition.json").read_text())["command"].startswith(
        "python -m benchmarks.sparse_recognition --smoke")
    assert all((out / name).stat().st_size > 0 for name in ("sparse_recognition.png",
                                                            "sparse_recognition_selections.png"))
    table = read_task_table(str(out / "sparse_recognition_card.json"))  # its model card takes it (evaluate_budgets)
    attentive = report["variants"]["single"]["probe"][line_name("LookWhere-S", 0.1, "selector")]["readers"][
        "attentive"]["accuracy"]
    assert ["k_ratio 0.1, its selector", "attentive"] == table["rows"][1][:2]
    assert table["rows"][1][-1] == f"{attentive['mean']:.3f} [{attentive['low']:.3f}, {attentive['high']:.3f}]"
    assert [g["goal"] for g in report["goals"]] == [
        "resolution_matters", "coverage_selector_over_random", "selector_coverage_vs_teacher_map",
        "accuracy_selector_minus_random", "lookwhere_vs_dense_teacher", "lookwhere_vs_equal_flops_teacher",
        "lookwhere_vs_dense_teacher_fine_tuned"]
    assert all("interval_half_width" in g for g in report["goals"])
    single = report["variants"]["single"]
    probed = set(single["probe"])
    for ratio, kinds in sr.FEATURE_LINES["single"].items():
        assert {line_name("LookWhere-S", ratio, kind) for kind in kinds} <= probed
    assert {DENSE, EQUAL} <= probed and any("k_mass" in name for name in probed)
    assert set(single["fine_tuned"]) == {line_name("LookWhere-S", 0.1, "selector"),
                                         line_name("LookWhere-S", 0.1, "random"), EQUAL, DENSE}
    assert all(line["schedule"]["over_epochs"] == 1 and line["resumed_after_epoch"] is None
               for line in single["fine_tuned"].values())
    assert report["student_protocol"]["chosen"] == "copy" and report["student"]["protocol"] == "copy"
    # the ceiling at k_ratio 0.25 keeps every label cell of a one-digit canvas (a 14 px digit spans at most 4 of 16)
    assert single["label_cell_coverage"][line_name("LookWhere-S", 0.25, "digits")]["mean"] == 1.0
    # the photo student's lines are its own selector's: its coverage recomputed by hand from its maps
    photo_line = line_name(sr.PHOTO_STUDENT, 0.1, "selector")
    assert {photo_line, line_name(sr.PHOTO_STUDENT, 0.1, "random")} <= probed
    test = task_splits(sr.parse_args(["--smoke"]), "majority")["test"]
    photo_student = load_photo_student(tmp_path / "photos", teacher)
    chosen = top_cells(selector_maps_of(photo_student, test, 4)[1], kept_for_ratio(0.1, 64))
    by_hand = coverage(chosen, test.label_cells).mean().item()
    majority = report["variants"]["majority"]
    assert majority["label_cell_coverage"][photo_line]["mean"] == pytest.approx(by_hand, abs=1e-6)
    assert "coverage: photo selector / random" in majority["comparisons"]
    assert report["photo_student"]["folder"] == str(tmp_path / "photos")
    assert report["where_target"]["used"] == max(report["where_target"]["coverage_top10"],
                                                 key=report["where_target"]["coverage_top10"].get)
    check_correct_lists(report, test.labels)
    check_fine_tuning_starts_from_the_probe_line(single)
    cached = sorted(path.name for path in (tmp_path / "cache").iterdir())
    assert len(cached) == 8  # dense and equal FLOPs, train and test, two variants
    rerun = sr.main([*common, "--out-dir", str(tmp_path / "again"), "--scratch-dir", str(tmp_path / "scratch2")])
    assert sorted(path.name for path in (tmp_path / "cache").iterdir()) == cached  # read, not computed again

    def untimed(variants: dict) -> dict:
        return json.loads(json.dumps(variants).replace('"train_time_s"', '"_"'), object_hook=lambda d: {
            k: v for k, v in d.items() if k != "_"})

    assert untimed(rerun["variants"]) == untimed(report["variants"])  # the same bits twice


@pytest.mark.slow
def test_smoke_run_on_photos_chooses_its_student_on_validation_and_resumes_its_fine_tuning(tmp_path):
    """--background photo --student-protocol choose: the photos' own results, both candidates read on validation
    canvases alone and the better one kept (its export where the model card reads it), the photo pools recorded
    disjoint; run again on the same --scratch-dir, every fine-tuned line goes on from its kept epoch (here: finished,
    so only its test answers are computed) to the same answers."""
    save_task_teacher(tmp_path / "teacher")
    save_extra_photos(tmp_path / "extra")
    argv = ["--smoke", "--background", "photo", "--student-protocol", "choose", "--teacher", str(tmp_path / "teacher"),
            "--extra-photos", str(tmp_path / "extra"), "--threads", "1", "--cache-dir", str(tmp_path / "cache"),
            "--out-dir", str(tmp_path / "out"), "--scratch-dir", str(tmp_path / "scratch")]
    report = sr.main(argv)
    assert json.loads((tmp_path / "out" / "sparse_recognition_photos.json").read_text())["goals"] == report["goals"]
    assert (tmp_path / "out" / "sparse_recognition_photos_card.json").is_file()
    pools = report["task"]["photos"]
    assert not set(pools["train"]["names"]) & set(pools["test"]["names"]) and "extra-1.jpg" in pools["test"]["names"]
    protocols = report["student_protocol"]
    assert set(protocols["candidates"]) == {"copy", "paper"}
    paper = protocols["candidates"]["paper"]
    assert paper["recipe"]["extractor_prefix"] == "selector" and paper["recipe"]["steps"] == sr.SMOKE["paper_steps"]
    assert paper["photos"] == pools["train"]["count"] and protocols["candidates"]["copy"]["photos"] == 0
    best = {name: max(c["validation"]["attentive"].values()) for name, c in protocols["candidates"].items()}
    assert protocols["chosen"] == ("paper" if best["paper"] > best["copy"] else "copy")
    kept = json.loads((tmp_path / "scratch" / "final" / "config.json").read_text())
    assert kept["extractor_prefix"] == protocols["candidates"][protocols["chosen"]]["recipe"]["extractor_prefix"]
    again = sr.main(argv)
    for name, line in again["variants"]["single"]["fine_tuned"].items():
        assert line["resumed_after_epoch"] == 1, name
        assert line["correct"] == report["variants"]["single"]["fine_tuned"][name]["correct"], name


def check_correct_lists(report: dict, labels: torch.Tensor) -> None:
    """Every line keeps one 0/1 per test canvas for each reader, whose mean is the accuracy it reports; a random line
    of several draws keeps each draw's and their mean per canvas."""
    for variant in report["variants"].values():
        for name, row in variant["probe"].items():
            for reader in row["readers"].values():
                assert len(reader["correct"]) == len(labels)
                assert sum(reader["correct"]) / len(labels) == pytest.approx(reader["accuracy"]["mean"])
                if "correct_per_draw" in reader:
                    per_canvas = torch.tensor(reader["correct_per_draw"]).float().mean(0)
                    torch.testing.assert_close(per_canvas, torch.tensor(reader["correct"]))
                else:
                    assert set(reader["correct"]) <= {0.0, 1.0}
        for row in variant["fine_tuned"].values():
            assert len(row["correct"]) == len(labels) and set(row["correct"]) <= {0, 1}
            assert sum(row["correct"]) / len(labels) == pytest.approx(row["accuracy"]["mean"])


def check_fine_tuning_starts_from_the_probe_line(single: dict) -> None:
    """Epoch 0 of each fine-tuned line is its probe line's linear head (random cells: draw 0's): the same validation
    accuracy, and where validation keeps epoch 0, the same test answers."""
    for name, tuned in single["fine_tuned"].items():
        linear = single["probe"][name]["readers"]["linear"]
        assert tuned["val_accuracy"][0] == pytest.approx(linear["val_accuracy"][str(linear["weight_decay"])])
        if tuned["epoch"] == 0:
            assert tuned["correct"] == linear.get("correct_per_draw", [linear["correct"]])[0]


def one_line(argv, capsys) -> str:
    """The one line the benchmark run as a command ends in (corevision_hf.cli.run, its __main__), exit status 2
    (before it on stderr, progress bars at most)."""
    capsys.readouterr()
    assert run(sr.main, argv) == 2
    err = capsys.readouterr().err
    assert err.endswith("\n") and err.count("error") == 1 and "Traceback" not in err, err
    line = err.splitlines()[-1]
    assert line.startswith("error: "), err
    return line


def test_a_missing_or_unfit_teacher_or_a_bad_argument_is_one_line(tmp_path, capsys):
    assert "nowhere" in one_line(["--smoke", "--teacher", str(tmp_path / "nowhere"), "--out-dir",
                                  str(tmp_path / "out")], capsys)
    Dinov2Model(Dinov2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                             patch_size=14)).save_pretrained(tmp_path / "shallow")
    from corevision_hf import VecaModel

    VecaModel(tiny_veca_config()).save_pretrained(tmp_path / "veca")
    for teacher, words in (("shallow", "at least 3"), ("veca", "DINOv2 teacher")):
        assert words in one_line(["--smoke", "--teacher", str(tmp_path / teacher), "--out-dir", str(tmp_path / "out")],
                                 capsys)
    save_task_teacher(tmp_path / "teacher")
    assert "--photo-student" in one_line(["--smoke", "--teacher", str(tmp_path / "teacher"), "--photo-student",
                                          str(tmp_path / "shallow"), "--out-dir", str(tmp_path / "out")], capsys)
    (tmp_path / "a_file").write_text("mine")
    for bad in (["--val", "0"], ["--canvas-size", "500"], ["--threads", "0"], ["--digit-size", "0"],
                ["--strokes", "-1"], ["--selector-size", "0"], ["--selector-steps", "-1"], ["--probe-decays", "-1"], ["--attentive-decays", "nan"],
                ["--freeze-extractor-steps", "99", "--steps", "3", "--joint-selector"], ["--steps", "-1"],
                ["--steps", "0", "--joint-selector"], ["--steps", "0", "--selector-steps", "0"],
                ["--extractor-prefix", "teacher"], ["--out-dir", str(tmp_path / "a_file")]):
        with pytest.raises(SystemExit) as done:
            sr.parse_args(bad)
        assert done.value.code == 2 and capsys.readouterr().err.count("error:") == 1, bad
    assert not (tmp_path / "out").exists() and (tmp_path / "a_file").read_text() == "mine"


def test_student_options_that_would_train_nothing_or_be_dropped_are_refused(tmp_path, capsys):
    """The review's two (today a run took them and silently trained something else), and the protocols' own; each a
    one-line parser error, while the combinations that train what they say still parse."""
    save_extra_photos(tmp_path / "extra")
    photos = ["--extra-photos", str(tmp_path / "extra")]
    for bad, words in (
            (["--freeze-extractor-steps", "99", "--steps", "3"], "nothing would train"),
            (["--freeze-extractor-steps", "2", "--steps", "3"], "nothing would train"),
            (["--joint-selector", "--steps", "300"], "no gradient from the extractor"),
            (["--joint-selector", "--steps", "300", "--extractor-prefix", "extractor"], "no gradient"),
            (["--student-protocol", "paper", "--steps", "5", *photos], "--steps describes the copy protocol"),
            (["--student-protocol", "choose", "--paper-steps", "40", *photos], "must exceed"),
            (["--student-protocol", "paper", "--extra-photos", str(tmp_path / "none")], "holds no photos")):
        with pytest.raises(SystemExit) as done:
            sr.parse_args(bad)
        err = capsys.readouterr().err
        assert done.value.code == 2 and err.count("error:") == 1 and words in err, (bad, err)
    for fine in (["--steps", "3"], ["--freeze-extractor-steps", "0", "--steps", "3"],
                 ["--steps", "3", "--joint-selector", "--extractor-prefix", "selector",
                  "--freeze-extractor-steps", "2"],
                 ["--student-protocol", "choose", *photos], ["--quick", "--student-protocol", "paper", *photos]):
        sr.parse_args(fine)


@pytest.mark.parametrize("benchmark", ["sparse_recognition", "sparse_recognition_veca"])
def test_folders_that_cannot_serve_and_a_pilot_of_no_whole_digit_size_are_refused_before_any_work(
        benchmark, tmp_path, capsys, monkeypatch):
    """Each of these ended in a traceback, a read-only --out-dir only after all the work: now parse_args refuses it in
    one line, and the command's __main__ (corevision_hf.cli.run) makes any later error one line too."""
    import importlib

    parse_args = importlib.import_module(f"benchmarks.{benchmark}").parse_args
    (tmp_path / "a_file").write_text("mine")

    def refused(argv) -> str:
        with pytest.raises(SystemExit) as done:
            parse_args(["--smoke", *argv])
        err = capsys.readouterr().err
        assert done.value.code == 2 and err.count("error:") == 1 and "Traceback" not in err, err
        return err.strip().splitlines()[-1]

    for flag in ("--cache-dir", "--scratch-dir", "--out-dir"):
        assert f"{flag} {tmp_path / 'a_file'} is a file" in refused([flag, str(tmp_path / "a_file")])
        assert f"{tmp_path / 'a_file'} is a file" in refused([flag, str(tmp_path / "a_file" / "below")])
    for chosen in ("14", 14.5, None, True) if benchmark == "sparse_recognition" else ():  # the VECA one takes no pilot
        pilot = tmp_path / "pilot.json"
        pilot.write_text(json.dumps({"choice": {"chosen": {"digit_size": chosen, "strokes": 4}}, "canvas_size": 112}))
        assert f"its chosen digit_size is {chosen!r}, not a whole number" in refused(["--pilot", str(pilot)])

    def read_only(*args, dir=None, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", dir)

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    assert f"--out-dir {tmp_path / 'out'} cannot be written (Read-only file system in {tmp_path})" in refused(
        ["--out-dir", str(tmp_path / "out"), "--scratch-dir", str(tmp_path)])
    assert not (tmp_path / "out").exists() and (tmp_path / "a_file").read_text() == "mine"
