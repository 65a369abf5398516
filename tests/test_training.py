"""The distillation scripts and their shared loop, end to end on a tiny random teacher and tiny images (CPU, no
network). Two-process runs are few and combined: they are the slowest tests of the suite."""

import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import types
from pathlib import Path

import datasets
import pytest
import torch
from conftest import (
    AT_TEACHER_WIDTH,
    ROOT,
    count_calls,
    launch_two_processes,
    lookwhere_args,
    read_metrics,
    tiny_veca_config,
    veca_args,
)
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoImageProcessor, AutoModel

from corevision_hf import LookWhereModel, VecaModel, lookwhere_from_teacher
from training import checkpointing, distill_lookwhere, distill_veca, loop, losses, run_lock
from training import teacher as teacher_module
from training.loop import check_processes_agree
from training.losses import lookwhere_loss, veca_loss
from training.schedule import draw, draw_int, warmup_cosine
from training.teacher_mean import load_teacher_mean
from training.teacher import teacher_targets, teacher_targets_and_map
from training.teacher_cache import TeacherCache

SCHEDULE = ["--max-steps", "4", "--warmup-steps", "2", "--lr", "1e-3", "--min-lr", "1e-4"]
GRAYS = [16 * i + 8 for i in range(16)]  # one gray level per image: a crop's mean tells which image it came from


@pytest.fixture(scope="module")
def saved_dataset(tmp_path_factory) -> str:
    """16 uniform gray images as a `datasets` dataset written by save_to_disk (what --streaming reads in the tests)."""
    folder = tmp_path_factory.mktemp("saved")
    images = [Image.new("RGB", (40, 36), (gray, gray, gray)) for gray in GRAYS]
    datasets.Dataset.from_dict({"image": images}, features=datasets.Features({"image": datasets.Image()})).save_to_disk(
        folder / "grays"
    )
    return str(folder / "grays")


METHODS = {"veca": (distill_veca, veca_args), "lookwhere": (distill_lookwhere, lookwhere_args)}


def expected_lrs(steps=4, warmup=2, lr=1e-3, min_lr=1e-4) -> list[float]:
    return [lr * warmup_cosine(step, warmup, steps, min_lr / lr) for step in range(steps)]


# ---------------------------------------------------------------------------------------------- one process


def test_veca_script_runs_and_exports(teacher_dir, image_dir, tmp_path, caplog):
    args = veca_args(teacher_dir, image_dir, tmp_path, "--max-steps", "3", "--checkpoint-every", "2")
    args.remove("--log-with")
    args.remove("none")  # the default tracker: tensorboard when installed, and no warning when it is not
    with caplog.at_level(logging.WARNING):
        distill_veca.main(args)
    assert not [record for record in caplog.records if "tensorboard" in record.getMessage().lower()]
    metrics = read_metrics(tmp_path)
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(m["num_cores"] in range(1, 9) for m in metrics)
    assert {"loss", "cls_cosine", "patch_cosine", "patch_mse", "lr", "grad_norm", "images_per_s", "step_time_s",
            "teacher_time_share", "data_time_share", "peak_memory_mib"} <= set(metrics[0])
    for m in metrics:  # the total is made of the logged terms: the names say what they hold
        assert m["loss"] == pytest.approx((1 - m["cls_cosine"]) + (1 - m["patch_cosine"]) + m["patch_mse"], rel=1e-5)
        assert m["images_per_s"] == pytest.approx(2 / m["step_time_s"], rel=1e-6)
        assert 0 < m["teacher_time_share"] < 1 and m["peak_memory_mib"] > 0
    model = AutoModel.from_pretrained(tmp_path / "final", trust_remote_code=True)
    assert model.config.output_projection_size is None and model.config.num_cores == 8
    assert (tmp_path / "final" / "modeling_veca.py").exists()
    assert AutoImageProcessor.from_pretrained(tmp_path / "final", trust_remote_code=True).patch_size == 8  # exported too
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["checkpoint_2", "checkpoint_3"]
    with safe_open(tmp_path / "final" / "teacher_mean.safetensors", "pt") as f:  # the centre: 3 steps of 2 crops
        assert f.metadata()["cls_count"] == "6" and int(f.metadata()["patch_count"]) % 6 == 0
        assert f.get_tensor("cls").shape == f.get_tensor("patch").shape == (32,)
    assert not list((tmp_path / "checkpoints" / "checkpoint_3").glob("*_1*"))  # the student alone, no teacher
    recipe = json.loads((tmp_path / "final" / "training_recipe.json").read_text())
    assert recipe["method"] == "veca" and recipe["steps"] == 3 and recipe["global_batch_size"] == 2
    assert recipe["command"].startswith("python -m training.distill_veca --teacher ")
    assert "--max-steps 3" in recipe["command"]
    assert distill_veca.parse_args(shlex.split(recipe["command"])[3:]) == distill_veca.parse_args(args)


def test_lookwhere_runs_the_teacher_once_per_step(teacher_dir, image_dir, tmp_path, monkeypatch):
    calls = []
    load = teacher_module.load_teacher

    def counted(name):
        model = load(name)
        model.register_forward_hook(lambda *_: calls.append(1))
        return model

    monkeypatch.setattr(teacher_module, "load_teacher", counted)
    distill_lookwhere.main(lookwhere_args(teacher_dir, image_dir, tmp_path, "--max-steps", "3",
                                          "--gradient-accumulation-steps", "2"))
    metrics = read_metrics(tmp_path)
    assert len(calls) == 3 * 2  # one forward per micro-batch gives tokens and attention map
    assert len(metrics) == 3 and all(2 <= m["k"] <= 8 for m in metrics)
    assert [m["k"] for m in metrics] == [draw_int(2, 8, 3, step) for step in range(3)]
    assert {"cls_mse", "patch_mse", "map_kl", "teacher_time_share"} <= set(metrics[0])
    assert isinstance(AutoModel.from_pretrained(tmp_path / "final"), LookWhereModel)
    assert json.loads((tmp_path / "final" / "training_recipe.json").read_text())["method"] == "lookwhere"


def test_two_identical_lookwhere_runs_give_bit_identical_weights(teacher_dir, image_dir, tmp_path):
    # On 2 threads, with the extractor's positions gathered by advanced indexing, the two runs' weights differed.
    torch.set_num_threads(2)  # restored by conftest's process_state_restored
    common = ["--max-steps", "2", "--image-size", "96", "--batch-size", "8", "--k-min", "130", "--k-max", "140",
              "--num-workers", "0"]
    for run in ("first", "second"):
        distill_lookwhere.main(lookwhere_args(teacher_dir, image_dir, tmp_path / run, *common))
    first, second = (load_file(tmp_path / run / "final" / "model.safetensors") for run in ("first", "second"))
    assert [name for name, tensor in first.items() if not torch.equal(second[name], tensor)] == []


def test_schedule_is_the_same_with_gradient_accumulation_and_resolutions_are_drawn(teacher_dir, image_dir, tmp_path):
    distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path / "plain", *SCHEDULE))
    distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path / "accumulated", *SCHEDULE,
                                "--gradient-accumulation-steps", "2", "--resolutions", "16:1,32:3"))
    plain, accumulated = read_metrics(tmp_path / "plain"), read_metrics(tmp_path / "accumulated")
    assert [m["lr"] for m in plain] == [m["lr"] for m in accumulated] == pytest.approx(expected_lrs(), rel=1e-12)
    assert [m["images_per_s"] * m["step_time_s"] for m in accumulated] == pytest.approx([4] * 4)
    checkpoint = tmp_path / "accumulated" / "checkpoints" / "checkpoint_4"
    optimizer = torch.load(checkpoint / "optimizer.bin", weights_only=True)
    assert optimizer["param_groups"][0]["lr"] == pytest.approx(expected_lrs()[-1], rel=1e-12)  # the rate used
    # the multi-resolution stage: one size per step, from (seed + 1, step), the student's grid follows it
    assert [m["resolution"] for m in accumulated] == [draw([16, 32], [1.0, 3.0], 4, step) for step in range(4)]
    assert {m["resolution"] for m in plain} == {32}
    assert AutoModel.from_pretrained(tmp_path / "accumulated" / "final", trust_remote_code=True).config.num_cores == 8


def test_losses_go_down_on_one_batch(teacher_dir):
    torch.manual_seed(0)
    teacher = AutoModel.from_pretrained(teacher_dir).eval()
    pixel_values = torch.randn(2, 3, 32, 32)
    cls, patches, teacher_map = teacher_targets_and_map(teacher, pixel_values, (4, 4))

    veca = VecaModel(tiny_veca_config(**AT_TEACHER_WIDTH))
    lookwhere = lookwhere_from_teacher(teacher, selector_depth=1, selector_image_size=16)
    for model, loss_fn in [
        (veca, lambda out: veca_loss(out.pooler_output, out.last_hidden_state[:, 4:], cls, patches)[0]),
        (lookwhere, lambda out: lookwhere_loss(out.pooler_output, out.last_hidden_state[:, 5:], out.selector_map,
                                               cls, patches, teacher_map)[0]),
    ]:
        model.eval()  # no coordinate augmentation: the same batch gives the same loss landscape
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        # LookWhere keeps every patch: with fewer, the kept set moves as the map learns and the filled cells' loss has a
        # floor, so one batch's loss wanders around a plateau (0.92 -> 0.73-0.81 at k=6) instead of going down.
        kwargs = {"num_cores": 4} if model is veca else {"k": 16}
        losses_seen = []
        for _ in range(30):
            loss = loss_fn(model(pixel_values, **kwargs))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses_seen.append(loss.item())
        assert losses_seen[-1] < 0.85 * losses_seen[0], losses_seen


def test_teacher_targets_and_map_match_eager_attention(teacher_dir):
    teacher = AutoModel.from_pretrained(teacher_dir, attn_implementation="eager").eval()
    pixel_values = torch.randn(2, 3, 32, 32)
    logits = {}
    attention = teacher.encoder.layer[-1].attention
    handle = attention.register_forward_hook(lambda m, a, out: logits.update(probs=out[1]))
    with torch.no_grad():
        teacher(pixel_values, output_attentions=True)
    handle.remove()
    # softmax over patch keys of the mean patch-query logits is not the mean of probabilities; compare logits
    # through log-probabilities instead: log p_ij - log p_ij' = l_ij - l_ij' within each query row.
    log_probs = logits["probs"].log()[:, :, 5:, 5:]  # patch queries, patch keys
    relative = (log_probs - log_probs[..., :1]).mean(dim=(1, 2))  # mean over heads and queries, relative to key 0
    cls, patches, ours = teacher_targets_and_map(teacher, pixel_values, (4, 4))
    torch.testing.assert_close(ours - ours[:, :1], relative, atol=1e-4, rtol=1e-4)
    for mine, plain in zip((cls, patches), teacher_targets(teacher, pixel_values, (4, 4))):  # the same forward's tokens
        torch.testing.assert_close(mine, plain, atol=0, rtol=0)


def test_teacher_cache_computes_each_crop_once(teacher_dir, image_dir, tmp_path, monkeypatch):
    calls = count_calls(monkeypatch, teacher_module, "teacher_targets")
    # 8 images, batch 2: 4 steps an epoch; 16 steps = 4 epochs, crops repeat every 2
    distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path, "--max-steps", "16", "--teacher-cache", "2",
                                "--checkpoint-every", "100"))
    assert len(calls) == 8
    assert len(list((tmp_path / "teacher_cache").glob("*.safetensors"))) == 16
    with pytest.raises(ValueError, match="other settings"):
        TeacherCache(str(tmp_path / "teacher_cache"), 3, {"teacher": teacher_dir})


# The authors' VECA recipe, small: NorMuon, the authors' crops, two phases of resolutions each read as its own stream
# with its own batch size, validation keeping OUT/best.
RECIPE_LIKE = ["--optimizer", "normuon", "--augment", "veca", "--resolutions", "16:1,32:1;3=32:1", "--batch-sizes",
               "16:3,32:2", "--max-grad-norm", "0", "--eval-every", "2", "--eval-images", "2", "--num-workers", "2"]


@pytest.mark.parametrize("method, streaming, extra", [("veca", False, []), ("lookwhere", True, []),
                                                      ("veca", False, RECIPE_LIKE)])
def test_resume_continues_to_the_same_weights(teacher_dir, image_dir, saved_dataset, tmp_path, method, streaming,
                                              extra):
    script, make_args = METHODS[method]
    # 16 streamed images or 8 in a folder, batch 2: the 6 steps cross an epoch boundary, the resume is mid-epoch
    data = saved_dataset if streaming else image_dir
    extra = [*extra, "--eval-data", image_dir] if extra else []
    common = ["--max-steps", "6", "--checkpoint-every", "2", *(["--streaming"] * streaming), *extra]
    script.main(make_args(teacher_dir, data, tmp_path / "straight", *common))
    script.main(make_args(teacher_dir, data, tmp_path / "resumed", *common, "--stop-at-step", "3"))
    assert not (tmp_path / "resumed" / "final").exists()
    script.main(make_args(teacher_dir, data, tmp_path / "resumed", *common, "--resume"))
    resumed_metrics = read_metrics(tmp_path / "resumed")
    assert [m["step"] for m in resumed_metrics] == [1, 2, 3, 4, 5, 6]  # resumed at step 2: step 3's line superseded
    straight_metrics = read_metrics(tmp_path / "straight")
    assert [m["loss"] for m in resumed_metrics[2:]] == [m["loss"] for m in straight_metrics[2:]]
    straight = load_file(tmp_path / "straight" / "final" / "model.safetensors")
    resumed = load_file(tmp_path / "resumed" / "final" / "model.safetensors")
    for name, tensor in straight.items():
        torch.testing.assert_close(resumed[name], tensor, atol=0, rtol=0, msg=name)
    centres = [load_teacher_mean(tmp_path / run / "final", 32) for run in ("straight", "resumed")]
    assert all(torch.equal(a, b) for a, b in zip(*centres))  # the centre's sums continue from the checkpoint
    if extra:  # every validation once, the same numbers, the same best
        lines = [(tmp_path / run / "validation.jsonl").read_text() for run in ("straight", "resumed")]
        assert lines[0] == lines[1] and [json.loads(line)["step"] for line in lines[0].splitlines()] == [2, 4, 6]
        assert (tmp_path / "straight" / "best" / "model.safetensors").read_bytes() == (
            tmp_path / "resumed" / "best" / "model.safetensors").read_bytes()


@pytest.mark.parametrize("method", ["veca", "lookwhere"])
def test_nan_loss_stops_with_the_last_checkpoint_intact(teacher_dir, image_dir, tmp_path, monkeypatch, method):
    script, make_args = METHODS[method]
    calls = []
    loss_name = f"{method}_loss"
    original = getattr(losses, loss_name)

    def loss_turning_nan(*args, **kwargs):
        calls.append(1)
        loss, terms = original(*args, **kwargs)
        return (loss * float("nan") if len(calls) == 3 else loss), terms

    monkeypatch.setattr(losses, loss_name, loss_turning_nan)
    with pytest.raises(FloatingPointError, match="last good checkpoint"):
        script.main(make_args(teacher_dir, image_dir, tmp_path, "--max-steps", "5", "--checkpoint-every", "1"))
    last = max((tmp_path / "checkpoints").iterdir(), key=lambda p: int(p.name.split("_")[1]))
    assert json.loads((last / "state.json").read_text())["step"] == 2
    weights = load_file(last / "model.safetensors")
    assert all(torch.isfinite(t).all() for t in weights.values())
    assert len(read_metrics(tmp_path)) == 2


def test_a_nan_loss_between_lines_stops_at_the_next_line_before_its_checkpoint(teacher_dir, image_dir, tmp_path,
                                                                                 monkeypatch):
    """--log-every 3: the loss turns NaN at step 4, which reads nothing on the host; step 6 (a line and a checkpoint)
    reads it and stops before its update and its checkpoint, naming step 4."""
    calls = []
    original = losses.veca_loss

    def loss_turning_nan(*args, **kwargs):
        calls.append(1)
        loss, terms = original(*args, **kwargs)
        return (loss * float("nan") if len(calls) == 4 else loss), terms

    monkeypatch.setattr(losses, "veca_loss", loss_turning_nan)
    message = r"Loss is nan at step 4; stopping at step 6, the next that reads values \(--log-every 3\)\. The last good"
    with pytest.raises(FloatingPointError, match=message):
        distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path, "--max-steps", "9", "--log-every", "3",
                                    "--checkpoint-every", "3"))
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["checkpoint_3"]
    assert [m["step"] for m in read_metrics(tmp_path)] == [3]


def test_a_line_holds_the_means_since_the_last_line(teacher_dir, image_dir, tmp_path):
    """The same run logged every step and every 2 steps: a line of the second is the mean of the first's two."""
    for name, every in [("every", "1"), ("pairs", "2")]:
        distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path / name, *SCHEDULE, "--log-every", every,
                                    "--gradient-accumulation-steps", "2"))
    every, pairs = read_metrics(tmp_path / "every"), read_metrics(tmp_path / "pairs")
    assert [m["step"] for m in pairs] == [2, 4]
    for line, (first, second) in zip(pairs, [every[0:2], every[2:4]]):
        for name in ("loss", "cls_cosine", "patch_cosine", "patch_mse", "grad_norm"):
            assert line[name] == pytest.approx((first[name] + second[name]) / 2, rel=1e-5), name
        assert line["lr"] == second["lr"] and line["num_cores"] == second["num_cores"]
        assert line["images_per_s"] * line["step_time_s"] == pytest.approx(4)  # 2 micro-batches of 2 images a step


def test_bad_setup_fails_before_training(teacher_dir, image_dir, tmp_path):
    with pytest.raises((FileNotFoundError, ValueError), match="missing"):
        distill_veca.main(veca_args(teacher_dir, str(tmp_path / "missing"), tmp_path / "out", "--max-steps", "1"))
    with pytest.raises(ValueError, match="multiple of the student's patch size"):
        distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path / "out2", "--max-steps", "1", "--image-size", "36"))
    with pytest.raises(ValueError, match="teacher"):
        distill_veca.main(veca_args(str(tmp_path / "no-teacher"), image_dir, tmp_path / "out3", "--max-steps", "1"))
    with pytest.raises(ValueError, match="fewer than one batch of 16"):
        distill_lookwhere.main(lookwhere_args(teacher_dir, image_dir, tmp_path / "out4", "--max-steps", "1",
                                              "--batch-size", "16"))
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


def snapshot(folder: Path) -> dict:
    return {path: path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def test_a_used_output_dir_takes_only_a_resume_of_the_same_run(teacher_dir, image_dir, tmp_path):
    distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path, "--max-steps", "2"))
    before = snapshot(tmp_path)
    refusals = [
        (distill_veca, veca_args, [], "already holds a run"),
        (distill_lookwhere, lookwhere_args, ["--resume"], "holds a run of training.distill_veca"),
        (distill_veca, veca_args, ["--resume", "--batch-size", "4"], "--batch-size was 2"),
        (distill_veca, veca_args, ["--resume", "--seed", "4"], "--seed was 3"),
        (distill_veca, veca_args, ["--resume", "--data", str(tmp_path / "other")], "--data was"),
        (distill_veca, veca_args, ["--resume", "--max-steps", "3"], "--max-steps was 2"),
    ]
    for script, make_args, extra, message in refusals:
        args = make_args(teacher_dir, image_dir, tmp_path, "--max-steps", "2", *extra)  # later flags win
        with pytest.raises(ValueError, match=message):
            script.main(args)
    assert snapshot(tmp_path) == before  # nothing written, nothing overwritten
    with pytest.raises(FileNotFoundError, match="no run to resume"):
        distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path / "new", "--max-steps", "2", "--resume"))


def a_marked_run(run) -> None:
    """A run folder as a run leaves it, each file marked as it marks it: run.json and metrics.jsonl in the folder's
    manifest, final/ in its own, a checkpoint in its manifest.json, the teacher cache by its names."""
    from corevision_hf.outputs import record
    from training.checkpointing import RunLog, file_digests

    (run / "final").mkdir(parents=True)
    (run / "final" / "model.safetensors").write_text("weights")
    record(str(run / "final"), ["model.safetensors"])
    checkpointing.write_json(str(run / "run.json"), {"script": "training.distill_veca"})
    record(str(run), ["run.json"], keep=True)
    RunLog(str(run), "metrics.jsonl").append({"step": 1})
    (run / "checkpoints" / "checkpoint_2").mkdir(parents=True)
    (run / "checkpoints" / "checkpoint_2" / "model.safetensors").write_text("state")
    checkpointing.write_json(str(run / "checkpoints" / "checkpoint_2" / "manifest.json"),
                             file_digests(str(run / "checkpoints" / "checkpoint_2")))
    (run / "checkpoints" / "checkpoint_4.partial").mkdir()  # a save cut short: the run's own scratch
    (run / "teacher_cache").mkdir()
    (run / "teacher_cache" / "0_3.safetensors").write_text("targets")


def test_overwrite_deletes_a_run_s_own_files_and_nothing_else(tmp_path):
    """--overwrite of a distillation run (training.checkpointing.delete_run_files) deletes what a run wrote, each file
    known by its mark, and leaves files beside them that no run writes."""
    from training.checkpointing import delete_run_files

    run = tmp_path / "run"
    a_marked_run(run)
    (run / "notes.txt").write_text("mine")
    delete_run_files(str(run))
    assert sorted(os.listdir(run)) == [".corevision_hf.json", "notes.txt"]


@pytest.mark.parametrize("theirs", ["final/onnx/model.onnx", "checkpoints/checkpoint_2/notes.txt",
                                    "checkpoints/mine", "teacher_cache/notes.txt", "logs/notes.txt", "run.json",
                                    "metrics.jsonl", "best", "checkpoints", "final/linked"])
def test_overwrite_deletes_nothing_when_a_run_file_is_a_user_s_or_a_link(tmp_path, theirs):
    """A file no mark lists (or one changed since: run.json, metrics.jsonl edited), or a link, at or inside what a run
    writes: one line naming it, nothing deleted, a link's target untouched. It deleted them all before."""
    from training.checkpointing import delete_run_files

    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    a_marked_run(run)
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("mine")
    path = run / theirs
    if theirs in ("best", "checkpoints", "final/linked"):
        if path.exists():
            shutil.rmtree(path)
        path.symlink_to(elsewhere)
    elif theirs in ("run.json", "metrics.jsonl"):
        with open(path, "a") as f:
            f.write("\n")
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("mine")
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    with pytest.raises(ValueError) as error:
        delete_run_files(str(run))
    assert f"{run} holds {theirs}, which no run wrote there (or which changed since)" in str(error.value)
    assert "Nothing was deleted" in str(error.value) and "\n" not in str(error.value)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before
    assert (elsewhere / "keep.txt").read_text() == "mine"


def test_the_trackers_logs_are_marked_at_the_end_of_a_run(tmp_path):
    """logs/ (the trackers' files, written until end_training) is marked by finish: a finished run's logs are
    replaced by --overwrite, a run stopped before its end leaves them unmarked (and kept)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from training.checkpointing import delete_run_files, finish, unmarked_run_files

    run = tmp_path / "run"
    a_marked_run(run)
    (run / "logs" / "distill_veca").mkdir(parents=True)
    (run / "logs" / "distill_veca" / "events.out.tfevents.1").write_bytes(b"scalars")
    assert unmarked_run_files(str(run), ["logs"]) == ["logs/distill_veca/events.out.tfevents.1"]
    AcceleratorState._reset_state()
    finish(Accelerator(), str(run))
    assert unmarked_run_files(str(run), ["logs"]) == []
    delete_run_files(str(run))
    assert not (run / "logs").exists()


def test_a_listing_left_in_the_output_folder_is_replaced_only_when_a_run_wrote_it(teacher_dir, image_dir, tmp_path):
    """A new run removed any image_files.json it found (a failed setup's); a user's file of that name stays now."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "image_files.json").write_text('{"mine": true}')
    with pytest.raises(ValueError, match=r"holds image_files.json, which no run wrote there"):
        distill_veca.main(veca_args(teacher_dir, image_dir, out, "--max-steps", "1"))
    assert (out / "image_files.json").read_text() == '{"mine": true}'


def test_a_run_marks_what_it_writes_and_overwrite_keeps_a_user_s_file_inside_final(teacher_dir, image_dir, tmp_path,
                                                                                   capsys):
    """A whole run (its checkpoints, best/, final/, logs and listing) is replaced by --overwrite; a file the user put
    under final/ stops it in one line, nothing deleted."""
    from corevision_hf.cli import run as run_command

    out = tmp_path / "out"
    argv = veca_args(teacher_dir, image_dir, out, "--max-steps", "2", "--checkpoint-every", "1", "--eval-every", "1",
                     "--eval-data", image_dir, "--eval-images", "2")
    distill_veca.main(argv)
    assert {"best", "final", "checkpoints", "image_files.json", "validation.jsonl"} <= set(os.listdir(out))
    (out / "final" / "onnx").mkdir()
    (out / "final" / "onnx" / "model.onnx").write_bytes(b"an export of mine")
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    capsys.readouterr()
    assert run_command(distill_veca.main, [*argv, "--overwrite"]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(f"error: {out} holds final/onnx/model.onnx, which no run wrote there"), error
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before
    (out / "final" / "onnx" / "model.onnx").unlink()
    distill_veca.main([*argv, "--overwrite"])
    assert read_metrics(out)[-1]["step"] == 2 and not (out / "final" / "onnx").exists()


def test_processes_must_agree_on_arguments():
    same = {"seed": 0, "batch_size": 2}
    check_processes_agree([same, dict(same)])
    with pytest.raises(ValueError, match=r"--seed is \[0, 1\] on processes 0..1"):
        check_processes_agree([same, {**same, "seed": 1}])


@pytest.mark.slow
def test_help_shows_defaults_without_importing_torch():
    code = (
        "import sys, io, contextlib\n"
        "from training import distill_veca, distill_lookwhere\n"
        "for script in (distill_veca, distill_lookwhere):\n"
        "    out = io.StringIO()\n"
        "    with contextlib.redirect_stdout(out):\n"
        "        try: script.parse_args(['--help'])\n"
        "        except SystemExit: pass\n"
        "    print(out.getvalue())\n"
        "print('torch imported:', 'torch' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert "torch imported: False" in result.stdout
    assert "(default: 0.0004)" in result.stdout and "(default: 0.0001)" in result.stdout  # VECA's and LookWhere's --lr


@pytest.mark.parametrize("method, extra, message", [
    ("veca", ["--max-steps", "0"], "--max-steps must be positive"),
    ("veca", ["--lr", "-1"], "--lr must be positive"),
    ("veca", ["--min-lr", "1"], "Need 0 <= --min-lr <= --lr"),
    ("veca", ["--warmup-steps", "-1"], "--warmup-steps must be 0 or more"),
    ("veca", ["--gradient-accumulation-steps", "0"], "--gradient-accumulation-steps must be positive"),
    ("veca", ["--log-every", "0"], "--log-every must be positive"),
    ("veca", ["--config-overrides", "{num_cores: 8"], "--config-overrides is not valid JSON"),
    ("veca", ["--resolutions", "256-1"], "expected \"size:weight,...\""),
    ("veca", ["--resolutions", "32:0"], "with positive numbers"),
    ("veca", ["--resolutions", "32:nan,16:1"], "with positive numbers"),
    ("veca", ["--resolutions", "32:inf"], "with positive numbers"),
    ("veca", ["--resolutions", "32:1e308,40:1e308"], "with positive numbers (each phase's sum finite)"),
    ("veca", ["--resolutions", "32:1,16:1,32:2"], "the phase from step 0 names [32] twice"),
    ("veca", ["--resolutions", "32:1;5=16:1"], "the phase from step 5 starts at or after --max-steps 2"),
    ("veca", ["--resolutions", "100000:1"], "Resolution 100000: 2 image(s) of 100000 x 100000 px need"),
    ("lookwhere", ["--image-size", "100000"], "--image-size 100000: 2 image(s) of 100000 x 100000 px need"),
    ("veca", ["--image-size", "0"], "--image-size must be positive"),
    ("veca", ["--resume", "--overwrite"], "choose one"),
    ("lookwhere", ["--k-min", "0"], "Need 1 <= k_min <= k_max"),
    ("lookwhere", ["--k-max", "17"], "Need 1 <= k_min <= k_max <= 16"),
    ("lookwhere", ["--selector-depth", "0"], "--selector-depth must be positive"),
    ("lookwhere", ["--freeze-extractor-steps", "2"], "--freeze-extractor-steps 2 is not below --max-steps 2: the "
                                                     "extractor would never train"),
    ("lookwhere", ["--freeze-extractor-steps", "7"], "--freeze-extractor-steps 7 is not below --max-steps 2"),
])
def test_bad_arguments_are_named(teacher_dir, image_dir, tmp_path, method, extra, message):
    script, make_args = METHODS[method]
    with pytest.raises((ValueError, FileNotFoundError), match=re.escape(message)):
        script.main(make_args(teacher_dir, image_dir, tmp_path / "out", "--max-steps", "2", *extra))
    # nothing written but, for an error found after the run took its folder, the run lock (never deleted: racy)
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == [run_lock.LOCK_FILE]


@pytest.mark.slow
def test_cli_user_error_is_one_line_and_exit_2(teacher_dir, image_dir, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "training.distill_veca",
         *veca_args(teacher_dir, image_dir, tmp_path / "out", "--max-steps", "2", "--batch-size", "0")],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == "error: --batch-size must be positive, got 0."
    assert "Traceback" not in result.stderr and not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------- two processes


@pytest.mark.slow
def test_two_processes_veca_schedule_and_draws(teacher_dir, image_dir, tmp_path):
    """One launch: the learning rate is logged step by step as with one process (= warmup_cosine), and every draw
    (core budget, resolution) is the same on both processes."""
    args = veca_args(teacher_dir, image_dir, tmp_path / "two", *SCHEDULE, "--resolutions", "16:1,32:1")
    launch_two_processes(tmp_path, "training.distill_veca", args)
    distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path / "one", *SCHEDULE, "--resolutions", "16:1,32:1"))
    two, one = read_metrics(tmp_path / "two"), read_metrics(tmp_path / "one")
    assert [m["lr"] for m in two] == [m["lr"] for m in one] == pytest.approx(expected_lrs(), rel=1e-12)
    for m, m1 in zip(two, one):
        assert m["num_cores_all_processes"] == [m["num_cores"]] * 2 and m["num_cores"] == m1["num_cores"]
        assert m["resolution_all_processes"] == [m["resolution"]] * 2
        assert m["images_per_s"] * m["step_time_s"] == pytest.approx(4)  # 2 images on each process
    assert len({m["num_cores"] for m in two}) > 1  # the budget does change from step to step
    recipe = json.loads((tmp_path / "two" / "final" / "training_recipe.json").read_text())
    assert recipe["num_processes"] == 2 and recipe["global_batch_size"] == 4


@pytest.mark.slow
def test_two_processes_lookwhere_streaming_schedule_and_disjoint_data(teacher_dir, saved_dataset, tmp_path):
    """One launch: processes started with different arguments are refused before anything is written; then a
    streamed save_to_disk dataset is split between the processes (disjoint parts that together cover it), the
    learning rate is logged as with one process, and k is the same on both processes."""
    args = lookwhere_args(teacher_dir, saved_dataset, tmp_path / "two", *SCHEDULE, "--streaming")
    launch_two_processes(tmp_path, "tests.distill_hooks", ["spy-on-data", str(tmp_path), *args])
    for rank in (0, 1):
        assert "--seed is [3, 4] on processes 0..1" in (tmp_path / f"refused_{rank}.txt").read_text()
    seen = [{round(value * 255) for value in json.loads((tmp_path / f"seen_{rank}.json").read_text())} for rank in (0, 1)]
    assert seen[0] and seen[1] and not seen[0] & seen[1]  # 4 steps x 2 images = each process's 8 images, once
    assert seen[0] | seen[1] == set(GRAYS)
    distill_lookwhere.main(lookwhere_args(teacher_dir, saved_dataset, tmp_path / "one", *SCHEDULE, "--streaming"))
    two, one = read_metrics(tmp_path / "two"), read_metrics(tmp_path / "one")
    assert [m["lr"] for m in two] == [m["lr"] for m in one] == pytest.approx(expected_lrs(), rel=1e-12)
    for m, m1 in zip(two, one):
        assert m["k_all_processes"] == [m["k"]] * 2 and m["k"] == m1["k"]


def test_a_second_run_into_the_folder_of_a_live_run_is_refused_and_a_dead_ones_lock_is_gone(teacher_dir, image_dir,
                                                                                            tmp_path):
    """Another process holds the folder's run lock (a run still going): --overwrite deletes nothing of its run. Once
    that process is killed (no clean-up: kill -9), the OS has released the lock and a run starts."""
    from corevision_hf.outputs import record

    out = tmp_path / "out"
    (out / "final").mkdir(parents=True)
    (out / "final" / "config.json").write_text("the live run's")
    record(str(out / "final"), ["config.json"])  # as the run's export marks it
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
         "fcntl.lockf(fd, fcntl.LOCK_EX); os.write(fd, str(os.getpid()).encode()); print(flush=True); time.sleep(600)",
         run_lock.lock_path(str(out))], stdout=subprocess.PIPE)
    try:
        holder.stdout.readline()  # the lock is held
        with pytest.raises(ValueError, match=rf"^Another run \(process {holder.pid}\) is writing into {out}: wait"):
            distill_veca.main(veca_args(teacher_dir, image_dir, out, "--max-steps", "1", "--overwrite"))
        assert (out / "final" / "config.json").read_text() == "the live run's"
    finally:
        holder.kill()
        holder.wait()
    distill_veca.main(veca_args(teacher_dir, image_dir, out, "--max-steps", "1", "--overwrite"))
    assert read_metrics(out)[0]["step"] == 1


def test_a_best_of_another_score_measure_is_replaced_by_the_first_new_score(tmp_path, monkeypatch):
    exported = []
    monkeypatch.setattr(loop, "export", lambda *args, **kwargs: exported.append(args[6]))
    accelerator = types.SimpleNamespace(print=print, is_main_process=True)
    args = types.SimpleNamespace(output_dir=str(tmp_path))

    def scoring(score):
        return lambda student: {"score": score, "score_measure": "centred cosine", "grid": []}

    best = (0.9, "cosine")  # a best/ from before the centred score, on the raw cosine that the mean token wins
    best = loop.validate_and_keep_best(accelerator, args, "s", None, scoring(0.3), None, 2, best)
    assert best == (0.3, "centred cosine") and exported == ["best"]
    best = loop.validate_and_keep_best(accelerator, args, "s", None, scoring(0.2), None, 4, best)
    assert best == (0.3, "centred cosine") and exported == ["best"]


def test_a_run_made_before_an_argument_existed_resumes_at_its_value_from_then(tmp_path):
    """run.json of an older version lacks the arguments added since: the run resumes at each one's value from before it
    existed (training.checkpointing.BEFORE_IT_EXISTED), and at no other; one with no such value is refused by name."""
    from training.checkpointing import check_new_or_resumed_run

    def record(args: dict) -> dict:
        return {"script": "training.distill_lookwhere", "args": args, "num_processes": 1}

    now = vars(distill_lookwhere.parse_args(["--teacher", "t", "--data", "d", "--output-dir", str(tmp_path),
                                             "--max-steps", "9", "--resume"]))
    # a LookWhere run from before the authors' step (#36) and the extractor's warm-up: none of these was "off" then
    added = ("config_overrides", "map_queries", "k_slots", "freeze_extractor_steps", "extractor_warmup_steps")
    old = {name: value for name, value in now.items() if name not in added}
    (tmp_path / "run.json").write_text(json.dumps(record({**old, "resume": False})))
    check_new_or_resumed_run(str(tmp_path), record(now))
    for name, value, message in [("map_queries", "authors", "--map-queries was 'patches'"),
                                 ("config_overrides", '{"layer_norm_eps": 1e-05}', "--config-overrides was '{}'"),
                                 ("freeze_extractor_steps", 100, "--freeze-extractor-steps was 0")]:
        with pytest.raises(ValueError, match=re.escape(f"--resume: {message} in the run in {tmp_path}, now {value!r}")):
            check_new_or_resumed_run(str(tmp_path), record({**now, name: value}))
    # from before --tf32 (TF32 off, torch's default then): resumes with --no-tf32 only
    (tmp_path / "run.json").write_text(json.dumps(record({n: v for n, v in old.items() if n != "tf32"})))
    with pytest.raises(ValueError, match="--tf32 was False"):
        check_new_or_resumed_run(str(tmp_path), record(now))
    check_new_or_resumed_run(str(tmp_path), record({**now, "tf32": False}))
    # from before --shuffle-buffer: streams were not shuffled, which no value gives again
    (tmp_path / "run.json").write_text(json.dumps(record({n: v for n, v in old.items() if n != "shuffle_buffer"})))
    with pytest.raises(ValueError, match="^--resume: the run in .* was made before --shuffle-buffer existed"):
        check_new_or_resumed_run(str(tmp_path), record(now))
