"""benchmarks.sparse_recognition_veca: its smoke run end to end, its goals, ratios and learning curves recomputed from
its own JSON, the conversion's start, checkpoints and per-block tables recomputed from the models, and the same bits
from a second run."""

import json
from types import SimpleNamespace

import pytest
import torch
from conftest import save_task_teacher
from transformers import Dinov2Model

from benchmarks import sparse_recognition_veca as srv
from corevision_hf import VecaModel, veca_flops, veca_from_teacher
from evaluation import evaluate_budgets
from evaluation.canvases import PhotoSplit, Pixels, task_splits
from evaluation.readers import probe
from publishing.model_card import read_task_table
from training.conversion import final_cosines, seed_core_bank, teacher_targets, transfer_errors
from training.schedule import draw

CHANCE = 0.1  # ten digit classes
CURVE = srv.SMOKE["curve_test_canvases"]  # the curves' test canvases: fewer than the smoke run's test canvases
STAGE1, STAGE2 = srv.SMOKE["stage1_steps"], srv.SMOKE["stage2_steps"]
CONVERSION_STEPS = [0, STAGE1, *(STAGE1 + s for s in STAGE2)]  # the conversion's curve: start, stage 1's end, stage 2


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
    scratch, converted = students[srv.FROM_SCRATCH], students[srv.FROM_TEACHER]
    assert scratch["steps"] == max(srv.SMOKE["curve_steps"]) and scratch["train_size"] == srv.SMOKE["train_size"]
    assert scratch["canvases"] == srv.SMOKE["train"] and scratch["photos"] == 7  # assets/photos
    # the conversion: at the canvas size, on the training canvases but the validation ones, and the photos
    assert converted["steps"] == STAGE1 + max(STAGE2) and converted["train_size"] == srv.SMOKE["canvas_size"]
    assert converted["canvases"] == srv.SMOKE["train"] - srv.SMOKE["val"] and converted["photos"] == 7
    assert (len(converted["stage1_losses"]), len(converted["stage2_losses"])) == (STAGE1, max(STAGE2))
    assert 0 < converted["stage1_time_s"] + converted["stage2_time_s"] < converted["conversion_time_s"]
    assert converted["conversion_time_s"] <= converted["train_time_s"]
    assert "encoder.layers.*.mlp.fc1.weight" in converted["init_from_teacher"]["copied"]
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
        canvases = CURVE if entry["goal"] == "learning_curve" else srv.SMOKE["test"]  # its lines are the curve's
        assert all(len(values) == canvases for values in entry["correct"].values())


def test_a_missed_goal_names_the_block_that_holds_the_conversion_back(smoke):
    _, report = smoke
    end = report["transfer_error"]["stages"]["stage2"]["per_block"]
    errors = end["student_c64"]
    block = errors.index(max(errors))
    expected = {"block": block, "cores": 64, "stage": "stage2", "error": errors[block],
                "uniform": end["uniform"][block], "pooled_bound": end["pooled_bound_c64"][block]}
    assert any(not entry["met"] for entry in report["goals"])  # the tiny run misses some: the field is exercised
    for entry in report["goals"]:
        assert entry["held_back_by"] == (None if entry["met"] else expected)


def test_the_curve_ends_at_the_final_lines_and_each_goal_is_followed_along_it(smoke):
    _, report = smoke
    assert report["curve_test_canvases"] == CURVE
    probe_rows = report["variants"]["single"]["probe"]
    stages = {srv.FROM_TEACHER: ["start", "stage1", *["stage2"] * len(STAGE2)],
              srv.FROM_SCRATCH: ["start", "distillation", "distillation"]}
    steps = {srv.FROM_TEACHER: CONVERSION_STEPS, srv.FROM_SCRATCH: srv.SMOKE["curve_steps"]}
    for name, points in report["learning_curve"].items():
        assert [p["steps"] for p in points] == steps[name] and [p["stage"] for p in points] == stages[name]
        assert all(set(p["accuracy"]) == {"8", "64"} for p in points)
        for point in points:  # every point on the curve's canvases, its accuracy theirs
            for c, correct in point["correct"].items():
                assert len(correct) == CURVE and point["accuracy"][c]["mean"] == pytest.approx(sum(correct) / CURVE)
        for c in srv.SMOKE["cores"]:  # the last point is the final student's line, on the curve's canvases
            assert points[-1]["correct"][str(c)] == probe_rows[srv.line_name(name, c)]["correct"][:CURVE]
    assert [p["stage_steps"] for p in report["learning_curve"][srv.FROM_TEACHER]] == [0, STAGE1, *STAGE2]
    goals = {g["goal"]: g for g in report["goals"]}
    teacher_curve = report["learning_curve"][srv.FROM_TEACHER]
    assert goals["learning_curve"]["curve"] == [
        {key: p[key] for key in ("stage", "stage_steps", "steps", "accuracy")} for p in teacher_curve]

    def at(c: str, point: dict) -> torch.Tensor:
        return torch.tensor(point["correct"][c]).double()

    dense = torch.tensor(probe_rows[srv.DENSE]["correct"][:CURVE]).double()
    scratch = torch.tensor(probe_rows[srv.line_name(srv.FROM_SCRATCH, 64)]["correct"][:CURVE]).double()
    values = {"veca_retention_c8": lambda p: float(at("8", p).mean() / at("64", p).mean().clamp(min=1e-12)),
              "veca_vs_dense_teacher": lambda p: float((at("64", p) - dense).mean()),
              "veca_from_teacher_vs_scratch": lambda p: float((at("64", p) - scratch).mean()),
              "learning_curve": lambda p: float(at("64", p).mean())}
    for name, entry in goals.items():  # each goal's value at each point, recomputed from the points' canvases
        assert [p["steps"] for p in entry["curve"]] == CONVERSION_STEPS
        if name != "learning_curve":
            recomputed = [values[name](p) for p in teacher_curve]
            assert [p["value"]["value"] for p in entry["curve"]] == pytest.approx(recomputed)
        change = entry["last_change"]
        assert (change["from_steps"], change["to_steps"]) == tuple(CONVERSION_STEPS[-2:])
        assert change["value"] == pytest.approx(values[name](teacher_curve[-1]) - values[name](teacher_curve[-2]))
        assert entry["still_rising"] == (change["low"] > 0)
    first, last = (at("64", teacher_curve[i]) for i in (0, -1))  # the last point minus the start, on the same canvases
    assert goals["learning_curve"]["value"]["mean"] == pytest.approx(float((last - first).mean()))


def seeded_start(args, teacher) -> VecaModel:
    """The conversion's start recomputed: the copy (the seed set first, as the conversion sets it) and its bank seeded
    from the teacher on the conversion's training images, batch by batch."""
    canvases = task_splits(args, "single")["train"].first(args.train - args.val)  # the validation canvases left out
    images = Pixels([canvases, PhotoSplit(args.train_photos, args.canvas_size)])
    torch.manual_seed(args.seed)
    start = veca_from_teacher(teacher, num_cores=64, image_size=args.canvas_size, training_budgets=args.cores).float()
    size = args.convert_batch_size
    seed_core_bank(start, teacher, [images[torch.arange(i, min(i + size, len(images)))]
                                    for i in range(0, len(images), size)], seed=args.seed)
    return start.eval()


def smoke_args(folder, run: str, *extra: str):
    return srv.parse_args(["--smoke", "--teacher", str(folder / "teacher"), "--scratch-dir", str(folder / run / "runs"),
                           *extra])


def test_a_checkpoint_read_by_the_curve_is_the_model_of_that_step(smoke):
    folder, report = smoke
    args = smoke_args(folder, "first")
    teacher = Dinov2Model.from_pretrained(str(folder / "teacher")).eval()
    starts = {srv.FROM_TEACHER: seeded_start(args, teacher), srv.FROM_SCRATCH: srv.scratch_student(args, teacher)}
    pixels = torch.randn(2, 3, 56, 56)
    for name, start in starts.items():
        final = VecaModel.from_pretrained(str(srv.run_dir(args, name) / "final")).eval()
        steps = [p["steps"] for p in report["learning_curve"][name]]
        with torch.inference_mode():
            outputs = {s: srv.model_at(args, name, start, s)(pixels, num_cores=8).last_hidden_state for s in steps}
            assert torch.equal(outputs[steps[-1]], final(pixels, num_cores=8).last_hidden_state)  # the export
            assert torch.equal(outputs[0], start.eval()(pixels, num_cores=8).last_hidden_state)
        assert all(not torch.equal(outputs[s], outputs[t]) for s, t in zip(steps, steps[1:]))  # each point moved
    # stage 1 moves the bank and the coordinate heads alone, from the seeded copy
    after_stage1 = srv.model_at(args, srv.FROM_TEACHER, starts[srv.FROM_TEACHER], STAGE1).state_dict()
    moved = {key for key, value in starts[srv.FROM_TEACHER].state_dict().items()
             if not torch.equal(value, after_stage1[key])}
    assert moved and all("core_bank" in key or "coordinate_heads" in key for key in moved)


def test_a_point_of_the_conversion_s_curve_is_its_checkpoint_read_by_the_probe(smoke):
    """The end of stage 1, probed at C = 64 on the training canvases and the curve's test canvases, gives the JSON's
    per-canvas correctness at that point."""
    folder, report = smoke
    args = smoke_args(folder, "first")
    teacher = Dinov2Model.from_pretrained(str(folder / "teacher")).eval()
    model = srv.model_at(args, srv.FROM_TEACHER, seeded_start(args, teacher), STAGE1)
    splits = task_splits(args, "single")
    train, test = (srv.veca_features(model, split, 64, args.batch_size)
                   for split in (splits["train"], splits["test"].first(CURVE)))
    predictions = probe(train, splits["train"].labels, test, args.val, args.probe_decays)["predictions"]
    point = report["learning_curve"][srv.FROM_TEACHER][1]
    assert point["stage"] == "stage1" and point["correct"]["64"] == (
        predictions == splits["test"].labels[:CURVE]).int().tolist()


def test_the_per_block_tables_and_cosines_are_the_start_s_and_the_end_s(smoke):
    """transfer_error and final_cosines in the JSON, at the start and at the end, recomputed from the seeded copy and
    the converted student on the validation canvases they name; each table's means are its blocks' means."""
    folder, report = smoke
    args = smoke_args(folder, "first")
    teacher = Dinov2Model.from_pretrained(str(folder / "teacher")).eval()
    first = args.train - args.val  # the first validation canvases
    val = task_splits(args, "single")["train"].pixels(slice(first, first + srv.SMOKE["table_canvases"]))
    targets = teacher_targets(teacher, val)
    models = {"start": seeded_start(args, teacher),
              "stage2": VecaModel.from_pretrained(str(srv.run_dir(args, srv.FROM_TEACHER) / "final")).eval()}
    stages = report["transfer_error"]["stages"]
    assert list(stages) == list(report["final_cosines"]["stages"]) == ["start", "stage1", "stage2"]
    for stage, model in models.items():
        table = transfer_errors(model, targets, [8, 64])
        assert set(stages[stage]["per_block"]) == set(table) >= {"uniform", "student_c64", "pooled_bound_c64"}
        for key, values in table.items():
            assert stages[stage]["per_block"][key] == pytest.approx(values, rel=1e-4, abs=1e-6)
            assert stages[stage]["mean"][key] == pytest.approx(sum(values) / len(values), rel=1e-4, abs=1e-6)
        with torch.inference_mode():
            cosines = final_cosines(model, teacher, val, 64)
        assert report["final_cosines"]["stages"][stage] == pytest.approx(cosines, rel=1e-4)
    assert stages["start"]["per_block"]["student_c64"] != stages["stage2"]["per_block"]["student_c64"]


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
    for key in ("transfer_error", "final_cosines"):
        assert again[key] == report[key]
    assert [again["students"][srv.FROM_TEACHER][f"stage{i}_losses"] for i in (1, 2)] == [
        report["students"][srv.FROM_TEACHER][f"stage{i}_losses"] for i in (1, 2)]
    for name in (srv.FROM_TEACHER, srv.FROM_SCRATCH):
        weights = [VecaModel.from_pretrained(str(folder / run / "runs" / name.replace(" ", "_") / "final")).state_dict()
                   for run in ("first", "second")]
        assert all(torch.equal(weights[0][key], weights[1][key]) for key in weights[0])


def test_a_finished_conversion_is_reused_under_its_key_and_done_again_under_another(smoke, monkeypatch):
    """A run whose scratch folder holds a finished conversion of the same key reuses it without converting and gives
    the first run's bits, its record saying so; another setting converts again, and so does a kept conversion that
    lacks a checkpoint of the curve."""
    import shutil

    from evaluation import task_conversion

    folder, report = smoke
    shutil.copytree(folder / "first" / "runs", folder / "reuse" / "runs")

    def converted_again(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(task_conversion, "convert", converted_again)
    again = run_smoke(folder, "reuse")
    assert again["learning_curve"] == report["learning_curve"] and again["goals"] == report["goals"]
    for key in ("transfer_error", "final_cosines"):
        assert again[key] == report[key]
    first, reused = (r["students"][srv.FROM_TEACHER] for r in (report, again))
    assert reused["conversion_reused"] and not first["conversion_reused"]
    assert reused["conversion_time_s"] == first["conversion_time_s"]
    assert reused["stage2_losses"] == first["stage2_losses"]
    with pytest.raises(AssertionError, match="converted again"):
        run_smoke(folder, "reuse", "--stage2-lr", "1e-4")  # another key: the kept conversion is deleted, not trusted
    assert not (folder / "reuse" / "runs" / srv.FROM_TEACHER.replace(" ", "_") / "conversion.json").exists()

    kept = folder / "lacking" / "runs"
    shutil.copytree(folder / "first" / "runs", kept)
    shutil.rmtree(task_conversion.checkpoint_path(kept / srv.FROM_TEACHER.replace(" ", "_"), STAGE1).parent)
    with pytest.raises(AssertionError, match="converted again"):
        run_smoke(folder, "lacking")


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


def test_the_committed_run_s_sizes_and_the_curve_s_canvases():
    """make tasks-veca's run: 400 training canvases (80 of them validation) and 500 test canvases, the curves' earlier
    points on the first 200; stage 2 at four points; the curve's canvases never more than the test canvases."""
    args = srv.parse_args([])
    assert (args.train, args.val, args.test, args.curve_test_canvases) == (400, 80, 500, 200)
    assert len(args.stage2_steps) >= 4 and args.stage1_steps > 0 and args.lora_rank == 0
    assert srv.parse_args(["--test", "50"]).curve_test_canvases == 50
    assert srv.parse_args(["--stage2-steps", "30", "10", "20", "10"]).stage2_steps == [10, 20, 30]


def test_bad_budgets_steps_and_sizes_are_one_line(capsys, tmp_path):
    for bad in (["--cores", "0", "8", "64"], ["--cores", "16", "32"], ["--curve-steps", "-1", "10"],
                ["--curve-steps", "333", "1000"], ["--train-size", "500"], ["--train-size", "602"], ["--train-photos", str(tmp_path / "none")],
                ["--val", "0"], ["--canvas-size", "500"], ["--threads", "0"], ["--finetune-epochs", "0"],
                ["--lr", "0"], ["--stage1-steps", "-1"], ["--stage1-lr", "0"], ["--stage2-lr", "nan"],
                ["--stage2-steps", "-2"], ["--stage2-steps", "0", "5"], ["--stage2-steps", *map(str, range(1, 22))],
                ["--lora-rank", "-1"], ["--convert-batch-size", "0"], ["--table-canvases", "0"],
                ["--val", "5", "--table-canvases", "6"], ["--curve-test-canvases", "0"]):
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
    canvases = srv.SMOKE["train"] - srv.SMOKE["val"]
    assert (f"by {STAGE1} steps of attention transfer and {max(STAGE2)} end to end" in table["caption"]
            and f"on {canvases} training canvases and 7 training photos" in table["caption"])
    assert json.loads((folder / "card" / "evaluation.json").read_text())["task_table"] == table


def test_no_step_measures_the_untrained_start_and_the_conversion_s_start_is_the_seeded_copy(smoke):
    folder, _ = smoke
    report = run_smoke(folder, "untrained", "--curve-steps", "0", "--stage1-steps", "0", "--stage2-steps", "0")
    assert not (folder / "untrained" / "runs" / "VECA-Ti_from_scratch").exists()  # nothing distilled
    args = smoke_args(folder, "untrained", "--curve-steps", "0", "--stage1-steps", "0", "--stage2-steps", "0")
    teacher = Dinov2Model.from_pretrained(str(folder / "teacher")).eval()
    start = seeded_start(args, teacher)
    saved = VecaModel.from_pretrained(str(srv.run_dir(args, srv.FROM_TEACHER) / "final")).state_dict()
    assert all(torch.equal(value, saved[key]) for key, value in start.state_dict().items())  # the seeded copy
    splits = task_splits(args, "single")
    train, test = (srv.veca_features(start, splits[s], 64, args.batch_size) for s in ("train", "test"))
    predictions = probe(train, splits["train"].labels, test, args.val, args.probe_decays)["predictions"]
    line = report["variants"]["single"]["probe"][srv.line_name(srv.FROM_TEACHER, 64)]
    assert line["correct"] == (predictions == splits["test"].labels).int().tolist()
    assert report["students"][srv.FROM_TEACHER]["steps"] == report["students"][srv.FROM_SCRATCH]["steps"] == 0
    assert [p["steps"] for p in report["learning_curve"][srv.FROM_TEACHER]] == [0]
    assert list(report["transfer_error"]["stages"]) == ["start"]
    assert "not trained further" in read_task_table(str(folder / "untrained" / "out" / srv.CARD_TABLE))["caption"]


def test_goals_are_decided_by_the_one_rule_on_lines_that_differ():
    def correct(hits: int) -> torch.Tensor:  # the first `hits` of 40 test canvases right
        return (torch.arange(40) < hits).float()

    # steps: (hits at C = 8, at C = 64); VECA-Ti's curve has steps of its own, and only its end is compared
    accuracy = {srv.FROM_TEACHER: {0: (8, 8), 100: (20, 30), 200: (38, 39)},
                srv.FROM_SCRATCH: {0: (4, 4), 500: (8, 10), 1000: (12, 12)}}
    curve = {name: {steps: {c: {"correct": correct(hits)} for c, hits in zip((8, 64), pair)}
                    for steps, pair in points.items()} for name, points in accuracy.items()}
    points = [{"stage": "start", "stage_steps": 0, "steps": 0}, {"stage": "stage1", "stage_steps": 100, "steps": 100},
              {"stage": "stage2", "stage_steps": 100, "steps": 200}]
    lines = {srv.DENSE: {"correct": correct(38), "gflops": 10.0}, srv.line_name(srv.FROM_TEACHER, 64): {"gflops": 8.0}}
    rows = torch.randint(0, 40, (500, 40), generator=torch.Generator().manual_seed(0))
    held = {"block": 3, "error": 0.5}

    def decide(curve_rows):
        return {g["goal"]: g for g in srv.goals(SimpleNamespace(lines=lines), curve, rows, curve_rows, points, held)}

    goals = decide(rows)
    retention = goals["veca_retention_c8"]
    assert retention["value"]["ratio"] == pytest.approx(38 / 39)  # C = 8 over C = 64
    assert [p["value"]["value"] for p in retention["curve"]] == pytest.approx([1.0, 20 / 30, 38 / 39])
    assert [p["stage"] for p in retention["curve"]] == ["start", "stage1", "stage2"]
    assert retention["last_change"]["value"] == pytest.approx(38 / 39 - 20 / 30) and retention["still_rising"]
    assert not retention["met"] and retention["short_by"] == pytest.approx(0.96 - retention["value"]["low"])
    assert retention["held_back_by"] == held
    dense = goals["veca_vs_dense_teacher"]
    assert dense["value"]["mean"] == pytest.approx(1 / 40) and dense["met"] and dense["short_by"] is None
    assert dense["held_back_by"] is None
    assert [p["value"]["value"] for p in dense["curve"]] == pytest.approx([-30 / 40, -8 / 40, 1 / 40])
    scratch = goals["veca_from_teacher_vs_scratch"]
    assert scratch["value"]["mean"] == pytest.approx(27 / 40) and scratch["met"]
    assert [p["value"]["value"] for p in scratch["curve"]] == pytest.approx([-4 / 40, 18 / 40, 27 / 40])  # its end
    learning = goals["learning_curve"]
    assert learning["value"]["mean"] == pytest.approx(31 / 40) and learning["met"]
    assert [(p["steps"], p["accuracy"]["8"]["mean"], p["accuracy"]["64"]["mean"]) for p in learning["curve"]] == [
        (0, 0.2, 0.2), (100, 0.5, 0.75), (200, 0.95, 0.975)]
    # the curve on the first 20 canvases: its points and the learning goal there, the final values on all 40
    first = decide(torch.randint(0, 20, (500, 20), generator=torch.Generator().manual_seed(0)))
    assert first["veca_retention_c8"]["value"] == retention["value"]
    assert [p["value"]["value"] for p in first["veca_retention_c8"]["curve"]] == pytest.approx([1.0, 1.0, 1.0])
    assert first["learning_curve"]["value"]["mean"] == pytest.approx(12 / 20)
    assert [p["value"]["value"] for p in first["veca_vs_dense_teacher"]["curve"]] == pytest.approx([-12 / 20, 0, 0])
    lines[srv.line_name(srv.FROM_TEACHER, 64)]["gflops"] = 12.0  # within 5 points, but not cheaper: missed
    dense = decide(rows)["veca_vs_dense_teacher"]
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


def test_pixels_number_the_images_of_several_splits_as_one_tensor_of_them():
    args = srv.parse_args(["--smoke"])
    splits = task_splits(args, "single")
    first, test = splits["train"].first(3), splits["test"]
    assert len(first) == 3 and torch.equal(first.labels, splits["train"].labels[:3])
    images = Pixels([first, test])
    whole = torch.cat([first.pixels(slice(0, 3)), test.pixels(slice(0, len(test)))])
    rows = torch.tensor([10, 0, 3, 2, 4])
    assert len(images) == 3 + len(test) and torch.equal(images[rows], whole[rows])
