"""benchmarks.sparse_recognition and the evaluation modules it reads: its measures checked by hand, and its smoke
mode end to end."""

import argparse
import json

import pytest
import torch
from conftest import save_task_teacher, tiny_veca_config
from transformers import Dinov2Config, Dinov2Model

from benchmarks import sparse_recognition as sr
from corevision_hf import LookWhereModel, lookwhere_from_teacher
from corevision_hf.lookwhere.budget_lookwhere import kept_for_ratio
from evaluation.canvases import CanvasDataset, Split, task_splits
from evaluation.finetune_protocol import FineTuned, finetune
from evaluation.lookwhere_features import selector_maps_of
from evaluation.paired_stats import bootstrap_rows, interval, ratio_interval
from evaluation.probes import fit_linear_classifier
from evaluation.readers import attentive_probe, probe
from evaluation.selections import coverage, pick_target, random_scores, selection_scores, top_cells
from evaluation.sparse_digits import CELL
from evaluation.task_lines import DENSE, EQUAL
from evaluation.task_student import TRAIN_K_RATIOS, distil_student, fit_selector_map, load_photo_student
from evaluation.teacher_passes import TeacherPasses, pass_record
from publishing.model_card import read_task_table
from training.data import DataStats


def test_coverage_is_the_share_of_label_cells_kept():
    label_cells = torch.tensor([[True, True, False, False, True], [False, False, False, False, False]])
    chosen = torch.tensor([[0, 2], [1, 3]])
    assert coverage(chosen, label_cells).tolist() == [pytest.approx(1 / 3), 0.0]  # no label cell: 0, not NaN


def test_a_canvas_gets_the_same_random_cells_in_any_batch():
    every = random_scores(range(6), 20, seed=3)
    assert torch.equal(random_scores([4, 1], 20, seed=3), every[[4, 1]])
    assert not torch.equal(random_scores(range(6), 20, seed=3, draw=1), every)  # another draw, other cells
    assert not torch.equal(random_scores(range(6), 20, seed=4), every)


def test_the_digit_ceiling_keeps_ink_cells_first_most_ink_first():
    split = Split.__new__(Split)
    split.digit_ink = torch.tensor([[0.0, 0.5, 0.0, 0.9, 0.1, 0.0]])
    scores = selection_scores("digits", split, torch.zeros(1, 6), {}, seed=0)
    assert top_cells(scores, 3).tolist() == [[1, 3, 4]]
    assert top_cells(scores, 4)[0].tolist().count(0) + top_cells(scores, 4)[0].tolist().count(2) + \
        top_cells(scores, 4)[0].tolist().count(5) == 1  # then one random empty cell


def test_the_where_target_picked_covers_the_most_label_cells():
    label_cells = torch.tensor([[True, False, False, False], [False, True, False, False]])
    maps = {"patches": torch.tensor([[0.0, 0, 1, 0], [0, 0, 1, 0]]),
            "cls": torch.tensor([[1.0, 0, 0, 0], [0, 0, 1, 0]])}
    where = pick_target(maps, label_cells, k=1)
    assert where["coverage_top10"] == {"patches": 0.0, "cls": 0.5} and where["picked"] == "cls"


def test_intervals_of_constant_and_paired_values():
    rows = bootstrap_rows(10, 200, seed=0)
    same = interval(torch.ones(10), rows)
    assert same["mean"] == same["low"] == same["high"] == 1.0 and same["half_width"] == 0.0
    values = torch.tensor([1.0, 0, 1, 0, 1, 0, 1, 0, 1, 0])
    spread = interval(values, rows)
    assert spread["mean"] == 0.5 and spread["low"] < 0.5 < spread["high"]
    ratio = ratio_interval(2 * values + 1, values + 1, rows)  # means 2 and 1.5
    assert ratio["ratio"] == pytest.approx(2 / 1.5) and ratio["low"] <= ratio["ratio"] <= ratio["high"]


def test_the_probe_chooses_its_decay_on_the_validation_canvases_alone():
    torch.manual_seed(0)
    features = torch.randn(40, 6)
    labels = torch.arange(40) % 10
    test_features = torch.randn(5, 6)
    first = probe(features, labels, test_features, val=10, decays=[1e-4, 1e-1])
    relabelled = labels.clone()
    relabelled[-10:] = (relabelled[-10:] + 1) % 10  # other validation labels can change the choice...
    second = probe(features, relabelled, test_features, val=10, decays=[1e-4, 1e-1])
    assert first["val_accuracy"] != second["val_accuracy"]
    # ...but never the head: it is fitted on the others alone (one scale for all), and it makes the line's predictions
    head = fit_linear_classifier(features[:30], labels[:30], 10, weight_decay=first["weight_decay"],
                                 per_feature=False)
    assert torch.equal(head(test_features), first["head"](test_features))
    assert torch.equal(first["predictions"], head(test_features).argmax(-1))


def test_the_attentive_probe_reads_the_token_that_carries_the_label():
    """Ten classes, each a direction in one token among 12 noise tokens at a random place: the mean token dilutes it
    12 times, attention finds it. Both probes are fitted on 240 sets, scored on 60 others."""
    generator = torch.Generator().manual_seed(0)
    count, tokens, width = 300, 12, 16
    labels = torch.arange(count) % 10
    sets = 0.5 * torch.randn(count, tokens, width, generator=generator)
    where = torch.randint(tokens, (count,), generator=generator)
    sets[torch.arange(count), where, :10] += 3 * torch.eye(10)[labels]
    sets[torch.arange(count), where, 10] += 4  # the marker a query can attend to
    attentive = attentive_probe(sets[:240], labels[:240], sets[240:], val=40, decays=[1e-3], seed=0)
    linear = probe(sets[:240].mean(1), labels[:240], sets[240:].mean(1), val=40, decays=[1e-3])
    attentive_accuracy = (attentive["predictions"] == labels[240:]).float().mean()
    linear_accuracy = (linear["predictions"] == labels[240:]).float().mean()
    assert attentive_accuracy >= 0.9 and attentive_accuracy >= linear_accuracy + 0.2
    again = attentive_probe(sets[:240], labels[:240], sets[240:], val=40, decays=[1e-3], seed=0)
    assert torch.equal(again["predictions"], attentive["predictions"])  # the same bits twice


def test_an_attentive_probe_starts_as_the_mean_token():
    from evaluation.attentive_probe import AttentivePooling

    tokens = torch.randn(3, 5, 4)
    probe = AttentivePooling(torch.zeros(4), torch.tensor(1.0), 2, heads=2)
    torch.testing.assert_close(probe.pool(tokens), torch.full((3, 2, 5), 0.2))
    mask = torch.tensor([[True, True, False, False, False]] * 3)
    torch.testing.assert_close(probe.pool(tokens, mask)[..., :2], torch.full((3, 2, 2), 0.5))


def test_teacher_passes_are_cached_and_recomputed_when_unreadable(tmp_path):
    save_task_teacher(tmp_path / "teacher")
    teacher = Dinov2Model.from_pretrained(str(tmp_path / "teacher")).eval()
    args = sr.parse_args(["--smoke"])
    split = task_splits(args, "single")["test"]
    passes = TeacherPasses(tmp_path / "cache", teacher, batch_size=4)
    first = passes.get(split, split.key, 112)
    with torch.inference_mode():
        hidden = teacher(split.pixels(slice(None))).last_hidden_state
    torch.testing.assert_close(first["cls"], hidden[:, 0])
    torch.testing.assert_close(first["patches"], hidden[:, 1:].half())
    files = list((tmp_path / "cache").iterdir())
    assert len(files) == 1
    files[0].write_bytes(files[0].read_bytes()[:100])  # a cut file is computed again, not trusted
    again = TeacherPasses(tmp_path / "cache", teacher, batch_size=4).get(split, split.key, 112)
    assert torch.equal(again["patches"], first["patches"]) and len(list((tmp_path / "cache").iterdir())) == 1
    other = task_splits(sr.parse_args(["--smoke", "--seed", "1"]), "single")["test"]
    assert passes.path(other.key, 112) != passes.path(split.key, 112) != passes.path(split.key, 56)
    with torch.no_grad():
        teacher.embeddings.cls_token.add_(1)  # another teacher's weights: another entry
    assert TeacherPasses(tmp_path / "cache", teacher, 4).path(split.key, 112) != passes.path(split.key, 112)


def test_the_map_only_phase_trains_the_selector_alone_towards_the_teachers_map(tmp_path):
    """fit_selector_map: the map loss falls on the canvases it trains on, the extractor is bit-identical, the same
    bits come twice, and 0 steps change nothing."""
    save_task_teacher(tmp_path / "teacher")
    teacher = Dinov2Model.from_pretrained(str(tmp_path / "teacher")).eval()
    args = sr.parse_args(["--smoke", "--lr", "1e-3"])
    split = task_splits(args, "single")["train"]
    dataset = CanvasDataset([split], DataStats())
    grid = (args.canvas_size // CELL,) * 2
    # the target: one canvas's label cells for every canvas, as logits (a tiny random selector cannot learn where
    # each canvas's digit is in a few steps, but it can learn a fixed map)
    maps = (split.label_cells[:1].float() * 8).expand(len(split), -1)

    def trained(steps: int):
        torch.manual_seed(0)
        student = lookwhere_from_teacher(teacher, selector_depth=3, selector_image_size=args.selector_size)
        args.selector_steps = steps
        fit_selector_map(student.selector, dataset, maps, args)
        return student

    def map_loss(student) -> float:
        with torch.inference_mode():
            logits = student.selector(split.pixels(slice(None)), grid, None)[1]
        return float(torch.nn.functional.kl_div(logits.log_softmax(-1), maps.log_softmax(-1), log_target=True,
                                                reduction="batchmean"))

    start, first, second = trained(0), trained(30), trained(30)
    assert map_loss(first) < 0.5 * map_loss(start), (map_loss(first), map_loss(start))
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values()))
    for name, value in start.state_dict().items():
        if name.startswith("extractor."):
            assert torch.equal(value, first.state_dict()[name]), name
    assert any(not torch.equal(value, first.state_dict()[name]) for name, value in start.state_dict().items()
               if name.startswith("selector."))


def test_an_option_given_wins_over_the_preset_even_at_its_default():
    assert sr.parse_args(["--smoke"]).steps == sr.SMOKE["steps"] != sr.parse_args([]).steps
    assert sr.parse_args(["--smoke", "--steps", str(sr.parse_args([]).steps)]).steps == sr.parse_args([]).steps
    assert sr.parse_args(["--smoke", "--batch-size", "8"]).batch_size == 8 != sr.SMOKE["batch_size"]


def test_the_distilled_selector_is_the_map_only_phase_s_unless_trained_jointly(tmp_path):
    """distil_student: after fit_selector_map the selector stays as it was (frozen) while the extractor learns; with
    --joint-selector it trains on with the joint loss, as in the paper."""
    save_task_teacher(tmp_path / "teacher")
    teacher = Dinov2Model.from_pretrained(str(tmp_path / "teacher")).eval()

    def distilled(*extra: str):
        args = sr.parse_args(["--smoke", "--teacher", str(tmp_path / "teacher"), "--scratch-dir",
                              str(tmp_path / "scratch"), *extra])
        splits = task_splits(args, "single")
        passes = TeacherPasses(tmp_path / "cache", teacher, args.batch_size)
        targets = pass_record(passes.get(splits["train"], splits["train"].key, args.canvas_size))
        torch.manual_seed(0)  # the map head's random start
        student, start = distil_student(args, teacher, [splits["train"]], [targets], "cls", 1)
        torch.manual_seed(0)
        after_map = lookwhere_from_teacher(teacher, selector_depth=3, selector_image_size=args.selector_size,
                                           extractor_prefix=args.extractor_prefix)
        fit_selector_map(after_map.selector, CanvasDataset([splits["train"]], DataStats()), targets["maps"]["cls"],
                         args)
        return student, start, after_map

    def same(first, second, prefix: str) -> bool:  # to 1e-9: the two map phases may run on other thread counts
        ours = second.state_dict()
        return all(torch.allclose(value, ours[name], rtol=0, atol=1e-9) for name, value in first.state_dict().items()
                   if name.startswith(prefix))

    student, start, after_map = distilled()
    assert same(student, after_map, "selector.") and not same(student, start, "selector.")
    assert not same(student, start, "extractor.")
    joint, _, after_map = distilled("--joint-selector")
    assert not same(joint, after_map, "selector.")
    copied, start, after_map = distilled("--steps", "0", "--extractor-prefix", "extractor")
    assert copied.config.extractor_prefix == "extractor"
    assert same(copied, after_map, "selector.") and same(copied, start, "extractor.")
    saved = LookWhereModel.from_pretrained(str(tmp_path / "scratch" / "final")).float()  # what make tasks' card reads
    assert same(saved, copied, "") and [p.name for p in (tmp_path / "scratch").glob("[!.]*")] == ["final"]
    recipe = json.loads((tmp_path / "scratch" / "final" / "training_recipe.json").read_text())
    assert (recipe["steps"], recipe["args"]["k_max"], recipe["args"]["extractor_prefix"]) == (
        0, kept_for_ratio(TRAIN_K_RATIOS[1], 64), "extractor")  # the smoke canvas: 8 x 8 cells


def entry(mean: float, low: float, high: float) -> dict:
    return {"mean": mean, "low": low, "high": high, "half_width": (high - low) / 2}


def report_with(gap: dict, lookwhere_minus_dense: dict, selector_minus_random: dict, dense: dict) -> dict:
    lookwhere = sr.line_name("LookWhere-S", 0.1, "selector")
    comparisons = {"teacher dense - teacher at equal FLOPs (best readers)": gap,
                   "coverage: selector / random": {"ratio": 4.0, "low": 3.2, "high": 5.0},
                   "coverage: teacher's cls map / random": {"ratio": 4.0, "low": 3.0, "high": 5.0},
                   "coverage: selector / teacher's cls map": {"ratio": 1.0, "low": 0.85, "high": 1.1},
                   "attentive: selector - random": selector_minus_random,
                   "fine-tuned: selector - random": selector_minus_random,
                   "selector (attentive) - teacher dense (best reader)": lookwhere_minus_dense,
                   "selector (attentive) - teacher at equal FLOPs (best reader)": entry(0.2, 0.1, 0.3)}
    probe = {DENSE: {"accuracy": dense}, lookwhere: {"readers": {"attentive": {"accuracy": entry(0.5, 0.4, 0.6)}}}}
    return {"variants": {"single": {"comparisons": comparisons, "probe": probe}}}


class Points:
    """A split of 2-D points for `finetune`: the pixels are the points themselves."""

    def __init__(self, points: torch.Tensor, labels: torch.Tensor):
        self.points, self.labels = points, labels

    def __len__(self) -> int:
        return len(self.labels)

    def pixels(self, rows) -> torch.Tensor:
        return self.points[rows]


@pytest.mark.parametrize("patience", [None, 1, 2])
def test_fine_tuning_stops_after_patience_epochs_without_a_better_validation_accuracy(patience):
    generator = torch.Generator().manual_seed(0)
    labels = torch.arange(48) % 2
    points = torch.randn(48, 2, generator=generator) + 2.0 * labels[:, None]  # two overlapping clusters
    backbone = torch.nn.Linear(2, 2)
    head = torch.nn.Linear(2, 2)
    with torch.no_grad():  # the start: a head that reads the wrong axis sign, well below what training reaches
        head.weight.copy_(-torch.eye(2)), head.bias.zero_(), backbone.weight.copy_(torch.eye(2)), backbone.bias.zero_()
    model = FineTuned(lambda net, rows, pixels, seed: net(pixels), backbone, head)
    args = argparse.Namespace(finetune_lr=1e-3, batch_size=8, finetune_epochs=12, finetune_patience=patience, seed=0)
    split = Points(points, labels)
    result = finetune(model, split, split, args, val=16)
    history = result["val_accuracy"]
    best = max(range(len(history)), key=lambda epoch: (history[epoch], -epoch))  # the first best
    assert result["epoch"] == best
    if patience is None:
        assert len(history) == 13 and not result["stopped_early"]
    else:  # it ran until `patience` epochs in a row had not beaten the best, and not one epoch more
        stop = next((epoch for epoch in range(1, 13)
                     if epoch - max(range(epoch + 1), key=lambda e: (history[e], -e)) >= patience), 12)
        assert len(history) - 1 == stop and result["stopped_early"] == (stop < 12)
    assert history[best] > history[0]  # it learnt: the start was not kept


def test_goals_are_met_or_missed_by_one_rule_an_interval_against_a_margin_and_a_reference_above_chance():
    costs = {"dense": 100.0, 0.1: 8.0}
    report = report_with(entry(0.3, 0.15, 0.45), entry(-0.02, -0.04, 0.0), entry(0.2, 0.05, 0.35),
                         entry(0.6, 0.5, 0.7))
    met = {g["goal"]: g["met"] for g in sr.goals(report, costs, "cls")}
    assert met == {"resolution_matters": True, "coverage_selector_over_random": True,
                   "selector_coverage_vs_teacher_map": False, "accuracy_selector_minus_random": True,
                   "lookwhere_vs_dense_teacher": True, "lookwhere_vs_equal_flops_teacher": True}
    # a mean above the margin is not enough: the interval's low end decides
    report = report_with(entry(0.3, 0.08, 0.5), entry(-0.02, -0.06, 0.02), entry(0.2, -0.01, 0.4),
                         entry(0.6, 0.5, 0.7))
    missed = {g["goal"]: g["met"] for g in sr.goals(report, costs, "cls")}
    assert not missed["resolution_matters"] and not missed["lookwhere_vs_dense_teacher"]
    assert not missed["accuracy_selector_minus_random"]
    # a dense teacher whose interval reaches chance decides nothing
    report = report_with(entry(0.3, 0.15, 0.45), entry(0.0, -0.01, 0.01), entry(0.2, 0.05, 0.35),
                         entry(0.2, 0.1, 0.3))
    goals = {g["goal"]: g for g in sr.goals(report, costs, "cls")}
    assert not goals["resolution_matters"]["met"] and goals["resolution_matters"]["interval_above_margin"]
    # and fewer than 10x the GFLOPs misses the dense-teacher goal whatever the accuracies
    assert not {g["goal"]: g["met"] for g in sr.goals(report_with(
        entry(0.3, 0.15, 0.45), entry(0.0, -0.01, 0.01), entry(0.2, 0.05, 0.35), entry(0.6, 0.5, 0.7)),
        {"dense": 40.0, 0.1: 8.0}, "cls")}["lookwhere_vs_dense_teacher"]


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
    table = read_task_table(str(out / sr.CARD_TABLE))  # the student's model card takes it (evaluate_budgets)
    attentive = report["variants"]["single"]["probe"][sr.line_name("LookWhere-S", 0.1, "selector")]["readers"][
        "attentive"]["accuracy"]
    assert ["k_ratio 0.1, its selector", "attentive"] == table["rows"][1][:2]
    assert table["rows"][1][-1] == f"{attentive['mean']:.3f} [{attentive['low']:.3f}, {attentive['high']:.3f}]"
    assert [g["goal"] for g in report["goals"]] == [
        "resolution_matters", "coverage_selector_over_random", "selector_coverage_vs_teacher_map",
        "accuracy_selector_minus_random", "lookwhere_vs_dense_teacher", "lookwhere_vs_equal_flops_teacher"]
    single = report["variants"]["single"]
    probed = set(single["probe"])
    for ratio, kinds in sr.FEATURE_LINES["single"].items():
        assert {sr.line_name("LookWhere-S", ratio, kind) for kind in kinds} <= probed
    assert {DENSE, EQUAL} <= probed and any("k_mass" in name for name in probed)
    assert set(single["fine_tuned"]) == {sr.line_name("LookWhere-S", 0.1, "selector"),
                                         sr.line_name("LookWhere-S", 0.1, "random"), EQUAL}
    # the ceiling at k_ratio 0.25 keeps every label cell of a one-digit canvas (a 14 px digit spans at most 4 of 16)
    assert single["label_cell_coverage"][sr.line_name("LookWhere-S", 0.25, "digits")]["mean"] == 1.0
    # the photo student's lines are its own selector's: its coverage recomputed by hand from its maps
    photo_line = sr.line_name(sr.PHOTO_STUDENT, 0.1, "selector")
    assert {photo_line, sr.line_name(sr.PHOTO_STUDENT, 0.1, "random")} <= probed
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


def test_a_missing_or_unfit_teacher_or_a_bad_argument_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        sr.main(["--smoke", "--teacher", str(tmp_path / "nowhere"), "--out-dir", str(tmp_path / "out")])
    assert str(done.value).startswith("error:") and "\n" not in str(done.value) and "nowhere" in str(done.value)
    Dinov2Model(Dinov2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                             patch_size=14)).save_pretrained(tmp_path / "shallow")
    from corevision_hf import VecaModel

    VecaModel(tiny_veca_config()).save_pretrained(tmp_path / "veca")
    for teacher, words in (("shallow", "at least 3"), ("veca", "DINOv2 teacher")):
        with pytest.raises(SystemExit) as done:
            sr.main(["--smoke", "--teacher", str(tmp_path / teacher), "--out-dir", str(tmp_path / "out")])
        assert words in str(done.value) and "\n" not in str(done.value)
    save_task_teacher(tmp_path / "teacher")
    with pytest.raises(SystemExit) as done:
        sr.main(["--smoke", "--teacher", str(tmp_path / "teacher"), "--photo-student", str(tmp_path / "shallow"),
                 "--out-dir", str(tmp_path / "out")])
    assert "--photo-student" in str(done.value) and "\n" not in str(done.value)
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
