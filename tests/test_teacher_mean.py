"""training.teacher_mean: the teacher's mean tokens over the training crops, the centre of the centred measures."""

import pytest
import torch

from training.teacher_mean import FILE, TeacherMean, load_state, load_teacher_mean, save_state


def test_the_centre_is_the_mean_over_every_token_and_survives_a_checkpoint_and_an_export(tmp_path):
    torch.manual_seed(0)
    batches = [(torch.randn(3, 8), torch.randn(3, 4, 8)), (torch.randn(2, 8), torch.randn(2, 9, 8))]  # two grids
    teacher_mean = TeacherMean()
    assert teacher_mean.centre() is None
    for cls, patches in batches[:1]:
        teacher_mean.update(cls, patches)
    save_state(teacher_mean, tmp_path, 0)
    resumed = TeacherMean()
    assert load_state(resumed, tmp_path, 0) and not load_state(TeacherMean(), tmp_path, 1)
    for mean in (teacher_mean, resumed):
        mean.update(*batches[1])
    cls, patch = teacher_mean.centre()
    torch.testing.assert_close(cls, torch.cat([c for c, _ in batches]).mean(0))
    torch.testing.assert_close(patch, torch.cat([p.flatten(0, 1) for _, p in batches]).mean(0))
    assert all(torch.equal(a, b) for a, b in zip(resumed.centre(), teacher_mean.centre()))
    teacher_mean.save(tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(load_teacher_mean(tmp_path), (cls, patch)))
    assert load_teacher_mean(tmp_path / "elsewhere") is None


def test_a_corrupt_file_is_one_line(tmp_path):
    (tmp_path / FILE).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(ValueError, match=r"is corrupt .*export the model folder again") as error:
        load_teacher_mean(tmp_path)
    assert "\n" not in str(error.value)
