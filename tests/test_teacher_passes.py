"""evaluation.teacher_passes: a pass is the teacher's own forward, cached once, recomputed when unreadable, and keyed
by the canvases, the size and the teacher's weights."""

import fcntl
import inspect
import os
import time

import torch
from conftest import save_task_teacher
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import Dinov2Model

from benchmarks import sparse_recognition as sr
from evaluation import sparse_digits, teacher_passes
from evaluation.canvases import Split, task_splits
from evaluation.teacher_passes import TeacherPasses, code_digest


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


def test_a_change_to_the_canvas_code_is_another_entry_and_a_comment_is_not(tmp_path, monkeypatch):
    """The canvases' drawing code is part of the key: after a change to how canvases are drawn, the old passes are not
    served. Its digest is of the code alone (a comment or a docstring changes nothing)."""
    source = inspect.getsource(sparse_digits)
    pixels = inspect.getsource(Split.pixels)
    assert teacher_passes.CANVAS_CODE == code_digest(source, pixels)
    assert "INK_LEVEL = 64" in source and "images - mean" in pixels
    assert code_digest(source.replace("INK_LEVEL = 64", "INK_LEVEL = 65"), pixels) != teacher_passes.CANVAS_CODE
    assert code_digest(source, pixels.replace("images - mean", "images - 0.5 * mean")) != teacher_passes.CANVAS_CODE
    commented = source.replace('"""A seeded', '"""Another docstring. A seeded').replace(
        "INK_LEVEL = 64", "INK_LEVEL = 64  # another comment")
    assert code_digest(commented, pixels) == teacher_passes.CANVAS_CODE
    save_task_teacher(tmp_path / "teacher")
    teacher = Dinov2Model.from_pretrained(str(tmp_path / "teacher")).eval()
    key = {"variant": "single", "split": "test"}
    before = TeacherPasses(tmp_path / "cache", teacher, 4).path(key, 112)
    monkeypatch.setattr(teacher_passes, "CANVAS_CODE", "0" * 64)
    assert TeacherPasses(tmp_path / "cache", teacher, 4).path(key, 112) != before


def test_a_pass_recorded_for_another_teacher_is_computed_again(tmp_path, capsys):
    save_task_teacher(tmp_path / "teacher")
    teacher = Dinov2Model.from_pretrained(str(tmp_path / "teacher")).eval()
    split = task_splits(sr.parse_args(["--smoke", "--test", "4"]), "single")["test"]
    passes = TeacherPasses(tmp_path / "cache", teacher, batch_size=4)
    first = passes.get(split, split.key, 56)
    path = passes.path(split.key, 56)
    with safe_open(str(path), "pt") as f:
        assert f.metadata() == {"teacher": passes.fingerprint, "canvas_code": teacher_passes.CANVAS_CODE}
    wrong = {name: tensor + 1 for name, tensor in first.items()}
    save_file(wrong, str(path), metadata={"teacher": "another", "canvas_code": teacher_passes.CANVAS_CODE})
    capsys.readouterr()
    again = passes.get(split, split.key, 56)
    assert torch.equal(again["cls"], first["cls"])  # the teacher's own pass, not the file's
    assert f"warning: {path} records another teacher than this run's" in capsys.readouterr().err
    with safe_open(str(path), "pt") as f:
        assert f.metadata()["teacher"] == passes.fingerprint  # replaced
    assert torch.equal(passes.get(split, split.key, 56)["cls"], first["cls"]) and not capsys.readouterr().err


def test_a_temporary_left_by_a_killed_writer_is_removed_by_the_next_run(tmp_path):
    """A write killed with -9 leaves its `.NAME.safetensors.*.tmp`; the next TeacherPasses removes it, but never a
    live writer's (locked) nor one just made (it may be about to be locked), nor anything else."""
    save_task_teacher(tmp_path / "teacher")
    teacher = Dinov2Model.from_pretrained(str(tmp_path / "teacher")).eval()
    cache = tmp_path / "cache"
    cache.mkdir()
    names = {name: cache / f".{'ab' * 16}.safetensors.{name}.tmp" for name in ("killed", "live", "fresh")}
    for path in names.values():
        path.write_bytes(b"half a pass")
    (cache / "notes.tmp").write_text("mine")
    old = time.time() - 2 * teacher_passes.STALE_AFTER_S
    for name in ("killed", "live"):
        os.utime(names[name], (old, old))
    with open(names["live"], "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        TeacherPasses(cache, teacher, batch_size=4)
    assert sorted(path.name for path in cache.iterdir()) == sorted(
        ["notes.tmp", names["live"].name, names["fresh"].name])


def test_the_teachers_fine_tuning_features_are_its_passes_registers_left_out(tmp_path):
    """What fine-tuning a teacher line trains through (evaluation.task_lines' `finetune_teacher`: teacher_features)
    is the probe's features at the start: for a teacher with registers, the mean over its patch tokens alone, at the
    canvas size and at a smaller one (the review: the equal-FLOPs line's fine-tuning averaged the registers in)."""
    from transformers import Dinov2WithRegistersConfig, Dinov2WithRegistersModel

    from evaluation.teacher_passes import compute_pass, pass_record, resized, teacher_features

    torch.manual_seed(0)
    teacher = Dinov2WithRegistersModel(Dinov2WithRegistersConfig(
        hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64, patch_size=14, image_size=56,
        num_register_tokens=4)).eval()
    split = task_splits(sr.parse_args(["--smoke", "--test", "3"]), "single")["test"]
    for size in (112, 56):
        features = pass_record(compute_pass(teacher, split, size, batch_size=4))["features"]
        pixels = split.pixels(slice(None))
        with torch.inference_mode():
            live = teacher_features(teacher, pixels if size == 112 else resized(pixels, size))
        torch.testing.assert_close(live, features, atol=2e-3, rtol=0)  # the pass keeps its patches in float16


def test_a_split_gives_the_same_pixels_for_one_canvas_as_for_many():
    """A batch of one canvas, as fine-tuning's last batch or a one-canvas split gives it (a one-element index tensor,
    which numpy reads as a plain index), keeps its batch axis: the row of the whole split's pixels."""
    split = task_splits(sr.parse_args(["--smoke", "--test", "3"]), "single")["test"]
    whole = split.pixels(slice(None))
    for rows in (torch.tensor([2]), torch.tensor([0, 2]), torch.tensor([1]).numpy(), slice(1, 2)):
        expected = whole[torch.as_tensor(range(3)[rows] if isinstance(rows, slice) else rows)]
        assert torch.equal(split.pixels(rows), expected)
