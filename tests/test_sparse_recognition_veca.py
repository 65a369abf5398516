"""benchmarks.sparse_recognition_veca: its smoke run end to end, its goals, ratios and learning curve recomputed from
its own JSON, its checkpoints read back, and the same bits from a second run."""

import json
from types import SimpleNamespace

import pytest
import torch
from conftest import save_task_teacher
from transformers import Dinov2Model

from benchmarks import sparse_recognition_veca as srv
from corevision_hf import VecaModel, veca_flops
from evaluation import evaluate_budgets
from evaluation.canvases import task_splits
from evaluation.readers import probe
from publishing.model_card import read_task_table
from training.schedule import draw

CHANCE = 0.1  # ten digit classes


def run_smoke(folder, name: str, *extra: str) -> dict:
    return srv.main(["--smoke", "--teacher", str(folder / "teacher"), "--out-dir", str(folder / name / "out"),
                     "--scratch-dir", str(folder / name / "runs"), "--cache-dir", str(folder / "cache"),
                     "--threads", "1", *extra])


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    folder = tmp_path_factory.mktemp("veca_task")
    save_task_teacher(folder / "teacher")
    run_smoke(folder, "first")
    return folder, json.loads((folder / "first" / "out" / "sparse_recognition_veca.json").read_text())


def test_smoke_run_measures_every_student_at_every_budget_beside_the_teacher(smoke):
    folder, report = smoke
    assert report["command"].startswith("python -m benchmarks.sparse_recognition_veca --smoke")
    probe_rows = report["variants"]["single"]["probe"]
    cores = srv.SMOKE["cores"]
    assert set(probe_rows) == {srv.DENSE, srv.EQUAL} | {srv.line_name(name, c) for name in (srv.FROM_TEACHER,
                                                                                            srv.FROM_SCRATCH)
                                                        for c in cores}
    assert all(row["ms_per_canvas"] > 0 and row["gflops"] > 0 for row in probe_rows.values())
    assert all(len(row["correct"]) == srv.SMOKE["test"] for row in probe_rows.values())
    students = report["students"]
    for record in students.values():
        assert record["steps"] == max(srv.SMOKE["curve_steps"]) and record["train_size"] == srv.SMOKE["train_size"]
        assert record["canvases"] == srv.SMOKE["train"] and record["photos"] == 7  # assets/photos
    assert "encoder.layers.*.mlp.fc1.weight" in students[srv.FROM_TEACHER]["init_from_teacher"]["copied"]
    assert [g["goal"] for g in report["goals"]] == ["veca_retention_c8", "veca_vs_dense_teacher",
                                                    "veca_from_teacher_vs_scratch", "learning_curve"]


def test_goals_and_retention_follow_from_the_lines_in_the_json(smoke):
    _, report = smoke
    result = report["variants"]["single"]
    probe_rows = result["probe"]

    def correct(name: str, cores: int | None = None) -> torch.Tensor:
        return torch.tensor(probe_rows[name if cores is None else srv.line_name(name, cores)]["correct"]).double()

    goals = {g["goal"]: g for g in report["goals"]}
    for name in (srv.FROM_TEACHER, srv.FROM_SCRATCH):  # C = 8 over C = 64, not the other way round
        full = correct(name, 64).mean()
        assert result["retention_c8"][name]["ratio"] == pytest.approx(float(correct(name, 8).mean() / full)
                                                                      if full else 0.0)
    retention = goals["veca_retention_c8"]
    assert retention["value"] == result["retention_c8"][srv.FROM_TEACHER]
    veca, dense = correct(srv.FROM_TEACHER, 64), correct(srv.DENSE)
    assert goals["veca_vs_dense_teacher"]["value"]["mean"] == pytest.approx(float((veca - dense).mean()))
    assert goals["veca_from_teacher_vs_scratch"]["value"]["mean"] == pytest.approx(
        float((veca - correct(srv.FROM_SCRATCH, 64)).mean()))
    for entry in goals.values():  # evaluation.goals' one rule, and how far off a missed goal is
        met = entry["value"]["low"] > entry["margin"] and entry["reference"]["low"] > CHANCE
        if entry["goal"] == "veca_vs_dense_teacher":
            cheaper = probe_rows[srv.line_name(srv.FROM_TEACHER, 64)]["gflops"] < probe_rows[srv.DENSE]["gflops"]
            assert entry["fewer_gflops"] == cheaper
            met = met and cheaper
        assert entry["met"] == met
        assert entry["short_by"] == (None if met else pytest.approx(max(0.0, entry["margin"] - entry["value"]["low"])))
        assert all(len(values) == srv.SMOKE["test"] for values in entry["correct"].values())


def test_the_curve_ends_at_the_final_lines_and_each_goal_is_followed_along_it(smoke):
    _, report = smoke
    probe_rows = report["variants"]["single"]["probe"]
    for name, points in report["learning_curve"].items():
        assert [p["steps"] for p in points] == srv.SMOKE["curve_steps"]
        assert all(set(p["accuracy"]) == {"8", "64"} for p in points)
        last = points[-1]
        for c in srv.SMOKE["cores"]:  # the last point is the final student's line, at every C
            line = probe_rows[srv.line_name(name, c)]
            assert last["accuracy"][str(c)] == line["accuracy"] and last["correct"][str(c)] == line["correct"]
    goals = {g["goal"]: g for g in report["goals"]}
    teacher_curve = report["learning_curve"][srv.FROM_TEACHER]
    assert goals["learning_curve"]["curve"] == [{"steps": p["steps"], "accuracy": p["accuracy"]}
                                                for p in teacher_curve]
    for entry in goals.values():
        if entry["goal"] != "learning_curve":  # the goal's value at its last point is the goal's value
            assert [p["steps"] for p in entry["curve"]] == srv.SMOKE["curve_steps"]
            final = entry["curve"][-1]["value"]
            assert final["value"] == pytest.approx(entry["value"].get("mean", entry["value"].get("ratio")))
        change = entry["last_change"]
        assert (change["from_steps"], change["to_steps"]) == tuple(srv.SMOKE["curve_steps"][-2:])
        assert entry["still_rising"] == (change["low"] > 0)
    accuracy = [torch.tensor(p["correct"]["64"]).double().mean() for p in teacher_curve]
    assert goals["learning_curve"]["last_change"]["value"] == pytest.approx(float(accuracy[-1] - accuracy[-2]))


def test_a_checkpoint_read_by_the_curve_is_the_model_of_that_step(smoke):
    folder, _ = smoke
    args = srv.parse_args(["--smoke", "--teacher", str(folder / "teacher"), "--scratch-dir",
                           str(folder / "first" / "runs")])
    teacher = Dinov2Model.from_pretrained(str(folder / "teacher")).eval()
    untrained = srv.new_students(args, teacher)
    pixels = torch.randn(2, 3, 56, 56)
    for name, start in untrained.items():
        final = VecaModel.from_pretrained(str(srv.run_dir(args, name) / "final")).eval()
        with torch.inference_mode():
            outputs = {steps: srv.model_at(args, name, start, steps)(pixels, num_cores=8).last_hidden_state
                       for steps in srv.SMOKE["curve_steps"]}
            assert torch.equal(outputs[4], final(pixels, num_cores=8).last_hidden_state)  # the last step is the export
            assert torch.equal(outputs[0], start.eval()(pixels, num_cores=8).last_hidden_state)
        assert not torch.equal(outputs[2], outputs[0]) and not torch.equal(outputs[2], outputs[4])


def test_a_second_run_gives_the_same_bits(smoke):
    folder, report = smoke
    again = run_smoke(folder, "second")
    assert again["learning_curve"] == report["learning_curve"]
    strip = ("ms_per_canvas", "train_time_s")
    for name in ("probe", "fine_tuned"):
        first, second = ({line: {k: v for k, v in row.items() if k not in strip}
                          for line, row in r["variants"]["single"][name].items()} for r in (report, again))
        assert first == second
    assert again["goals"] == report["goals"]
    for name in (srv.FROM_TEACHER, srv.FROM_SCRATCH):
        weights = [VecaModel.from_pretrained(str(folder / run / "runs" / name.replace(" ", "_") / "final")).state_dict()
                   for run in ("first", "second")]
        assert all(torch.equal(weights[0][key], weights[1][key]) for key in weights[0])


def test_elastic_fine_tuning_draws_a_budget_per_step_and_is_measured_at_every_budget(smoke):
    _, report = smoke
    result = report["variants"]["single"]
    tuned = result["fine_tuned"]
    assert list(tuned) == [srv.line_name(srv.FROM_TEACHER, c) for c in srv.SMOKE["cores"]]
    budgets, weights = (report["students"][srv.FROM_TEACHER][key]
                        for key in ("training_budgets", "training_budget_weights"))
    fit = srv.SMOKE["train"] - srv.SMOKE["val"]
    steps = -(-fit // srv.SMOKE["batch_size"]) * srv.SMOKE["finetune_epochs"]
    expected = [draw(budgets, weights, srv.SMOKE.get("seed", 0), step) for step in range(steps)]
    assert len(set(expected)) > 1  # the smoke run draws more than one budget
    for name, row in tuned.items():
        assert row["budgets_drawn"] == expected  # one per step, as nested dropout draws it
        assert len(row["val_accuracy"]) == srv.SMOKE["finetune_epochs"] + 1  # the start (the probe's head), each epoch
        assert row["epoch"] == row["val_accuracy"].index(max(row["val_accuracy"]))  # the first best
        assert row["gflops"] == result["probe"][name]["gflops"] and row["ms_per_canvas"] > 0
        assert row["fine-tuned - probe"]["mean"] == pytest.approx(
            row["accuracy"]["mean"] - result["probe"][name]["accuracy"]["mean"])
        assert row["accuracy"]["mean"] == pytest.approx(sum(row["correct"]) / len(row["correct"]))


def test_c64_of_a_64_core_bank_is_the_full_budget(smoke):
    folder, report = smoke
    model = VecaModel.from_pretrained(str(folder / "first" / "runs" / "VECA_from_teacher" / "final")).eval()
    assert model.config.num_cores == 64
    size = report["task"]["canvas_size"]
    assert report["variants"]["single"]["probe"][srv.line_name(srv.FROM_TEACHER, 64)]["gflops"] == pytest.approx(
        veca_flops(model.config, size) / 1e9)
    pixels = torch.randn(1, 3, size, size)
    with torch.inference_mode():
        assert torch.equal(model(pixels, num_cores=64).last_hidden_state, model(pixels).last_hidden_state)


def test_results_go_under_outputs_unless_told():
    for flags in ([], ["--quick"]):
        args = srv.parse_args(flags)
        assert all("outputs" in str(path) and "benchmarks/results" not in str(path)
                   for path in (args.out_dir, args.scratch_dir, args.cache_dir))


def test_bad_budgets_steps_and_sizes_are_one_line(capsys, tmp_path):
    for bad in (["--cores", "0", "8", "64"], ["--cores", "16", "32"], ["--curve-steps", "-1", "10"],
                ["--curve-steps", "333", "1000"], ["--train-size", "500"], ["--train-size", "602"], ["--train-photos", str(tmp_path / "none")],
                ["--val", "0"], ["--canvas-size", "500"], ["--threads", "0"], ["--finetune-epochs", "0"],
                ["--lr", "0"]):
        with pytest.raises(SystemExit) as done:
            srv.parse_args(bad)
        assert done.value.code == 2 and capsys.readouterr().err.count("error:") == 1


def test_the_card_table_is_the_json_s_lines_and_evaluate_budgets_puts_it_on_the_card(smoke):
    folder, report = smoke
    out = folder / "first" / "out"
    table = read_task_table(str(out / srv.CARD_TABLE))
    probe_rows = report["variants"]["single"]["probe"]
    cores = srv.SMOKE["cores"]
    assert [row[0] for row in table["rows"]] == [f"{c} cores, frozen + linear probe" for c in cores] + [
        f"{c} cores, elastic fine-tuned" for c in cores] + [
        f"the teacher, dense at {srv.SMOKE['canvas_size']} px, frozen + linear probe",
        f"the teacher at {report['teacher_equal_flops_size']} px (the GFLOPs of 64 cores), frozen + linear probe"]
    for c, row in zip(cores, table["rows"]):
        accuracy = probe_rows[srv.line_name(srv.FROM_TEACHER, c)]["accuracy"]
        assert row[3] == f"{accuracy['mean']:.3f} [{accuracy['low']:.3f}, {accuracy['high']:.3f}]"
    student = folder / "first" / "runs" / "VECA_from_teacher" / "final"
    evaluate_budgets.main([str(student), "--budgets", *map(str, cores), "--resolutions",
                           str(srv.SMOKE["canvas_size"]), "--latency-runs", "1", "--output-dir",
                           str(folder / "card"), "--card", "--task-table", str(out / srv.CARD_TABLE)])
    card = (folder / "card" / "README.md").read_text()
    assert f"## {table['title']}" in card and "| " + " | ".join(table["rows"][0]) + " |" in card
    assert json.loads((folder / "card" / "evaluation.json").read_text())["task_table"] == table


def test_curve_steps_0_measures_the_untrained_start(smoke):
    folder, _ = smoke
    report = run_smoke(folder, "untrained", "--curve-steps", "0")
    assert not (folder / "untrained" / "runs").exists()  # nothing trained
    args = srv.parse_args(["--smoke", "--curve-steps", "0"])
    teacher = Dinov2Model.from_pretrained(str(folder / "teacher")).eval()
    untrained = srv.new_students(args, teacher)[srv.FROM_TEACHER].eval()
    splits = task_splits(args, "single")
    train, test = (srv.veca_features(untrained, splits[s], 64, args.batch_size) for s in ("train", "test"))
    predictions = probe(train, splits["train"].labels, test, args.val, args.probe_decays)["predictions"]
    line = report["variants"]["single"]["probe"][srv.line_name(srv.FROM_TEACHER, 64)]
    assert line["correct"] == (predictions == splits["test"].labels).int().tolist()
    assert report["students"][srv.FROM_TEACHER]["steps"] == 0
    assert [p["steps"] for p in report["learning_curve"][srv.FROM_TEACHER]] == [0]
    assert "not trained" in read_task_table(str(folder / "untrained" / "out" / srv.CARD_TABLE))["caption"]


def test_goals_are_decided_by_the_one_rule_on_lines_that_differ():
    def correct(hits: int) -> torch.Tensor:  # the first `hits` of 40 test canvases right
        return (torch.arange(40) < hits).float()

    accuracy = {srv.FROM_TEACHER: {0: (8, 8), 100: (20, 30), 200: (38, 39)},  # steps: (hits at C = 8, at C = 64)
                srv.FROM_SCRATCH: {0: (4, 4), 100: (8, 10), 200: (12, 12)}}
    curve = {name: {steps: {c: {"correct": correct(hits)} for c, hits in zip((8, 64), pair)}
                    for steps, pair in points.items()} for name, points in accuracy.items()}
    lines = {srv.DENSE: {"correct": correct(38), "gflops": 10.0}, srv.line_name(srv.FROM_TEACHER, 64): {"gflops": 8.0}}
    rows = torch.randint(0, 40, (500, 40), generator=torch.Generator().manual_seed(0))
    goals = {g["goal"]: g for g in srv.goals(SimpleNamespace(lines=lines), curve, rows)}
    retention = goals["veca_retention_c8"]
    assert retention["value"]["ratio"] == pytest.approx(38 / 39)  # C = 8 over C = 64
    assert [p["value"]["value"] for p in retention["curve"]] == pytest.approx([1.0, 20 / 30, 38 / 39])
    assert retention["last_change"]["value"] == pytest.approx(38 / 39 - 20 / 30) and retention["still_rising"]
    assert not retention["met"] and retention["short_by"] == pytest.approx(0.96 - retention["value"]["low"])
    dense = goals["veca_vs_dense_teacher"]
    assert dense["value"]["mean"] == pytest.approx(1 / 40) and dense["met"] and dense["short_by"] is None
    assert [p["value"]["value"] for p in dense["curve"]] == pytest.approx([-30 / 40, -8 / 40, 1 / 40])
    scratch = goals["veca_from_teacher_vs_scratch"]
    assert scratch["value"]["mean"] == pytest.approx(27 / 40) and scratch["met"]
    assert [p["value"]["value"] for p in scratch["curve"]] == pytest.approx([4 / 40, 20 / 40, 27 / 40])
    learning = goals["learning_curve"]
    assert learning["value"]["mean"] == pytest.approx(31 / 40) and learning["met"]
    assert [(p["steps"], p["accuracy"]["8"]["mean"], p["accuracy"]["64"]["mean"]) for p in learning["curve"]] == [
        (0, 0.2, 0.2), (100, 0.5, 0.75), (200, 0.95, 0.975)]
    lines[srv.line_name(srv.FROM_TEACHER, 64)]["gflops"] = 12.0  # within 5 points, but not cheaper: missed
    dense = srv.goals(SimpleNamespace(lines=lines), curve, rows)[1]
    assert not dense["met"] and dense["interval_above_margin"] and not dense["fewer_gflops"] and dense["short_by"] == 0


def test_a_scratch_student_its_config_refuses_is_refused_as_parsed(capsys):
    """--scratch-heads 3 with --scratch-width 32 failed in VecaConfig after the teacher's passes, in a traceback."""
    with pytest.raises(SystemExit) as done:
        srv.parse_args(["--smoke", "--scratch-width", "32", "--scratch-heads", "3"])
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.count("error:") == 1, err
    assert "--scratch-width 32, --scratch-depth 2, --scratch-heads 3: hidden_size (32) must be divisible by " \
           "num_attention_heads (3)" in err
    assert srv.parse_args(["--smoke", "--scratch-width", "48", "--scratch-heads", "3"]).scratch_heads == 3
