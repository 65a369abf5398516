"""benchmarks.sparse_recognition_veca: its smoke run end to end, its goals and ratios recomputed from its own JSON."""

import json

import pytest
import torch
from conftest import save_task_teacher
from transformers import Dinov2Model

from benchmarks import sparse_recognition_veca as srv
from benchmarks.sparse_recognition import probe, task_splits
from corevision_hf import VecaModel, veca_flops
from evaluation import evaluate_budgets
from publishing.model_card import read_task_table


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    folder = tmp_path_factory.mktemp("veca_task")
    save_task_teacher(folder / "teacher")
    srv.main(["--smoke", "--teacher", str(folder / "teacher"), "--out-dir", str(folder / "out"), "--scratch-dir",
              str(folder / "scratch"), "--threads", "1"])
    return folder, json.loads((folder / "out" / "sparse_recognition_veca.json").read_text())


def test_smoke_run_measures_every_student_at_every_budget_beside_the_teacher(smoke):
    folder, report = smoke
    assert report["command"].startswith("python -m benchmarks.sparse_recognition_veca --smoke")
    probe = report["variants"]["single"]["probe"]
    cores = srv.SMOKE["cores"]
    assert set(probe) == {srv.DENSE, srv.EQUAL} | {srv.line_name(name, c) for name in (srv.FROM_TEACHER,
                                                                                       srv.FROM_SCRATCH) for c in cores}
    assert all(row["ms_per_canvas"] > 0 and row["gflops"] > 0 for row in probe.values())
    students = report["students"]
    assert students[srv.FROM_TEACHER]["steps"] == students[srv.FROM_SCRATCH]["steps"] == srv.SMOKE["steps"]
    assert "encoder.layers.*.mlp.fc1.weight" in students[srv.FROM_TEACHER]["init_from_teacher"]["copied"]
    assert [g["goal"] for g in report["goals"]] == ["veca_retention_c8", "veca_vs_dense_teacher",
                                                    "veca_from_teacher_vs_scratch"]


def test_goals_and_retention_follow_from_the_lines_in_the_json(smoke):
    _, report = smoke
    result = report["variants"]["single"]
    probe = result["probe"]

    def accuracy(name: str, cores: int | None = None) -> float:
        return probe[name if cores is None else srv.line_name(name, cores)]["accuracy"]["mean"]

    goals = {g["goal"]: g for g in report["goals"]}
    for name in (srv.FROM_TEACHER, srv.FROM_SCRATCH):  # C = 8 over C = 64, not the other way round
        full = accuracy(name, 64)
        by_hand = accuracy(name, 8) / full if full else 0.0
        assert result["retention_c8"][name]["ratio"] == pytest.approx(by_hand)
    veca, dense = probe[srv.line_name(srv.FROM_TEACHER, 64)], probe[srv.DENSE]
    chance = 1 / 10  # ten digit classes
    assert goals["veca_retention_c8"]["met"] == (
        veca["accuracy"]["low"] > chance and result["retention_c8"][srv.FROM_TEACHER]["ratio"] >= 0.96)
    assert goals["veca_vs_dense_teacher"]["met"] == (
        dense["accuracy"]["low"] > chance and veca["accuracy"]["mean"] >= dense["accuracy"]["mean"] - 0.05
        and veca["gflops"] < dense["gflops"])
    difference = goals["veca_from_teacher_vs_scratch"]["value"]
    assert difference["mean"] == pytest.approx(accuracy(srv.FROM_TEACHER, 64) - accuracy(srv.FROM_SCRATCH, 64))
    assert goals["veca_from_teacher_vs_scratch"]["met"] == (difference["mean"] > 2 * difference["half_width"])


def test_the_fine_tuned_line_is_chosen_on_validation_and_compared_with_its_own_probe(smoke):
    _, report = smoke
    result = report["variants"]["single"]
    name = srv.line_name(srv.FROM_TEACHER, 8)  # --finetune-cores' default
    assert list(result["fine_tuned"]) == [name]
    tuned = result["fine_tuned"][name]
    assert len(tuned["val_accuracy"]) == srv.SMOKE["finetune_epochs"] + 1  # the start (the probe's head), each epoch
    assert tuned["epoch"] == tuned["val_accuracy"].index(max(tuned["val_accuracy"]))  # the first best
    assert tuned["gflops"] == result["probe"][name]["gflops"] and tuned["ms_per_canvas"] > 0
    assert tuned["fine-tuned - probe"]["mean"] == pytest.approx(
        tuned["accuracy"]["mean"] - result["probe"][name]["accuracy"]["mean"])


def test_c64_of_a_64_core_bank_is_the_full_budget(smoke):
    folder, report = smoke
    model = VecaModel.from_pretrained(str(folder / "scratch" / srv.FROM_TEACHER.replace(" ", "_") / "final")).eval()
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
                   for path in (args.out_dir, args.scratch_dir))


def test_bad_budgets_and_sizes_are_one_line(capsys):
    for bad in (["--cores", "0", "8"], ["--val", "0"], ["--canvas-size", "500"], ["--threads", "0"],
                ["--cores", "8", "64", "--finetune-cores", "16"], ["--finetune-epochs", "0"]):
        with pytest.raises(SystemExit) as done:
            srv.parse_args(bad)
        assert done.value.code == 2 and capsys.readouterr().err.count("error:") == 1


def test_the_card_table_is_the_json_s_lines_and_evaluate_budgets_puts_it_on_the_card(smoke):
    folder, report = smoke
    table = read_task_table(str(folder / "out" / srv.CARD_TABLE))
    probe = report["variants"]["single"]["probe"]
    cores = srv.SMOKE["cores"]
    assert [row[0] for row in table["rows"]] == [f"{c} cores, frozen + linear probe" for c in cores] + [
        "8 cores, fine-tuned", f"the teacher, dense at {srv.SMOKE['canvas_size']} px, frozen + linear probe",
        f"the teacher at {report['teacher_equal_flops_size']} px (the GFLOPs of 64 cores), frozen + linear probe"]
    for c, row in zip(cores, table["rows"]):
        accuracy = probe[srv.line_name(srv.FROM_TEACHER, c)]["accuracy"]
        assert row[3] == f"{accuracy['mean']:.3f} [{accuracy['low']:.3f}, {accuracy['high']:.3f}]"
    student = folder / "scratch" / srv.FROM_TEACHER.replace(" ", "_") / "final"
    evaluate_budgets.main([str(student), "--budgets", *map(str, cores), "--resolutions",
                           str(srv.SMOKE["canvas_size"]), "--latency-runs", "1", "--output-dir",
                           str(folder / "card"), "--card", "--task-table", str(folder / "out" / srv.CARD_TABLE)])
    card = (folder / "card" / "README.md").read_text()
    assert f"## {table['title']}" in card and "| " + " | ".join(table["rows"][0]) + " |" in card
    assert json.loads((folder / "card" / "evaluation.json").read_text())["task_table"] == table


def test_steps_0_measures_the_untrained_start(smoke):
    folder, _ = smoke
    report = srv.main(["--smoke", "--steps", "0", "--teacher", str(folder / "teacher"), "--out-dir",
                       str(folder / "untrained"), "--scratch-dir", str(folder / "untrained_runs"), "--threads", "1"])
    assert not (folder / "untrained_runs").exists()  # nothing trained
    args = srv.parse_args(["--smoke", "--steps", "0"])
    teacher = Dinov2Model.from_pretrained(str(folder / "teacher")).eval()
    untrained = srv.new_students(args, teacher)[srv.FROM_TEACHER].eval()
    splits = task_splits(args, "single")
    train, test = (srv.veca_features(untrained, splits[s], 64, args.batch_size) for s in ("train", "test"))
    predictions = probe(train, splits["train"].labels, test, args.val, args.probe_decays)["predictions"]
    by_hand = float((predictions == splits["test"].labels).float().mean())
    line = report["variants"]["single"]["probe"][srv.line_name(srv.FROM_TEACHER, 64)]
    assert line["accuracy"]["mean"] == pytest.approx(by_hand)
    assert report["students"][srv.FROM_TEACHER]["steps"] == 0
    assert "not trained" in read_task_table(str(folder / "untrained" / srv.CARD_TABLE))["caption"]
