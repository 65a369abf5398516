"""evaluation.teacher_passes: a pass is the teacher's own forward, cached once, recomputed when unreadable, and keyed
by the canvases, the size and the teacher's weights."""

import torch
from conftest import save_task_teacher
from transformers import Dinov2Model

from benchmarks import sparse_recognition as sr
from evaluation.canvases import task_splits
from evaluation.teacher_passes import TeacherPasses


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
