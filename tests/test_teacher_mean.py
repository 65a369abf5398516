"""training.teacher_mean: the teacher's mean tokens over the training crops, the centre of the centred measures."""

import json
import re

import pytest
import torch
from conftest import launch_two_processes, veca_args
from safetensors import safe_open
from safetensors.torch import save_file

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
    assert all(torch.equal(a, b) for a, b in zip(load_teacher_mean(tmp_path, 8), (cls, patch)))
    assert load_teacher_mean(tmp_path / "elsewhere", 8) is None


def test_the_validation_centre_is_fixed_at_the_first_validation_and_kept_by_a_checkpoint(tmp_path):
    torch.manual_seed(0)
    teacher_mean = TeacherMean()
    assert teacher_mean.validation_centre() is None
    teacher_mean.update(torch.randn(3, 8), torch.randn(3, 4, 8))
    first = teacher_mean.validation_centre()
    assert all(torch.equal(a, b) for a, b in zip(first, teacher_mean.centre()))
    teacher_mean.update(torch.randn(2, 8) + 5, torch.randn(2, 9, 8) + 5)  # the running mean moves on
    assert not torch.equal(teacher_mean.centre()[0], first[0])
    assert all(torch.equal(a, b) for a, b in zip(teacher_mean.validation_centre(), first))  # every later validation
    save_state(teacher_mean, tmp_path, 0)
    resumed = TeacherMean()
    load_state(resumed, tmp_path, 0)
    resumed.update(torch.randn(2, 8) - 5, torch.randn(2, 4, 8) - 5)
    assert all(torch.equal(a, b) for a, b in zip(resumed.validation_centre(), first))
    teacher_mean.save(tmp_path)  # the export keeps the running mean over every training crop
    assert all(torch.equal(a, b) for a, b in zip(load_teacher_mean(tmp_path, 8), teacher_mean.centre()))


def test_every_validation_of_a_run_and_of_its_resume_uses_one_centre(teacher_dir, image_dir, tmp_path, monkeypatch):
    from training import distill_veca
    from training.validation import HeldOutAgreement

    centres, score = [], HeldOutAgreement.__call__

    def spy(self, student, teacher, centre=None):
        centres.append(centre)
        return score(self, student, teacher, centre)

    monkeypatch.setattr(HeldOutAgreement, "__call__", spy)
    common = ["--max-steps", "4", "--eval-every", "2", "--checkpoint-every", "2", "--eval-data", image_dir,
              "--eval-images", "2"]
    distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path / "straight", *common))
    distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path / "resumed", *common, "--stop-at-step", "3"))
    distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path / "resumed", *common, "--resume"))
    assert len(centres) == 4  # steps 2 and 4, then step 2 before the stop and step 4 after the resume
    assert all(torch.equal(a, b) for centre in centres[1:] for a, b in zip(centre, centres[0]))


def test_a_corrupt_file_is_one_line(tmp_path):
    (tmp_path / FILE).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(ValueError, match=r"is corrupt .*export the model folder again") as error:
        load_teacher_mean(tmp_path, 8)
    assert "\n" not in str(error.value)


@pytest.mark.slow
def test_two_processes_validate_with_the_pooled_centre_and_a_resume_keeps_each_process_sums(teacher_dir, image_dir,
                                                                                          tmp_path):
    """Each process sums its own crops; validation and the export use the sum over both; a resume continues each."""
    common = ["--max-steps", "4", "--checkpoint-every", "2", "--eval-every", "2", "--eval-data", image_dir]
    launch_two_processes(tmp_path, "training.distill_veca", veca_args(teacher_dir, image_dir, tmp_path / "straight",
                                                                      *common))
    resumed = veca_args(teacher_dir, image_dir, tmp_path / "resumed", *common)
    launch_two_processes(tmp_path, "training.distill_veca", [*resumed, "--stop-at-step", "2"])
    assert sorted(p.name for p in (tmp_path / "resumed" / "checkpoints" / "checkpoint_2").glob("teacher_mean_*")) == [
        "teacher_mean_0.safetensors", "teacher_mean_1.safetensors"]
    launch_two_processes(tmp_path, "training.distill_veca", [*resumed, "--resume"])
    straight, again = (read(tmp_path / run / "final" / FILE) for run in ("straight", "resumed"))
    assert straight[0] == again[0] and straight[0]["cls_count"] == "16"  # 4 steps x 2 processes x 2 crops
    assert all(torch.equal(straight[1][name], again[1][name]) for name in ("cls", "patch"))
    lines = [json.loads(line) for line in (tmp_path / "straight" / "validation.jsonl").read_text().splitlines()]
    assert all(line["score_measure"] == "centred cosine" for line in lines)


def read(path) -> tuple[dict, dict]:
    """(metadata, tensors) of a teacher_mean.safetensors (its header's key order is not fixed: compare values)."""
    with safe_open(path, "pt") as f:
        return f.metadata(), {name: f.get_tensor(name) for name in f.keys()}


BAD_MEANS = {
    "width 1": (torch.ones(1), "holds means of width 1, not the model's output width 8"),
    "another width": (torch.ones(5), "holds means of width 5, not the model's output width 8"),
    "NaN": (torch.tensor([0.5] * 7 + [float("nan")]), "holds NaN or infinite values"),
    "inf": (torch.tensor([0.5] * 7 + [float("inf")]), "holds NaN or infinite values"),
    "integers": (torch.ones(8, dtype=torch.int64), "holds torch.int64 tensors, not floating point"),
}


@pytest.mark.parametrize("case", BAD_MEANS)
def test_a_mean_that_would_centre_wrongly_is_one_line_naming_the_file(tmp_path, case):
    """Width 1 broadcasts, NaN, inf and integers change every centred score silently: evaluate_budgets (which reads it
    through agreement_centre) refuses them, naming the file, before any score is written."""
    from evaluation.evaluate_budgets import agreement_centre

    tensor, message = BAD_MEANS[case]
    save_file({"cls": tensor, "patch": tensor.clone()}, tmp_path / FILE)
    targets = (torch.randn(2, 8), torch.randn(2, 4, 8))  # the teacher's CLS and patch tokens, 8 wide
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / FILE} {message}")) as error:
        agreement_centre(str(tmp_path), targets)
    assert "\n" not in str(error.value)
    save_file({"cls": torch.ones(8), "patch": torch.zeros(8)}, tmp_path / FILE)  # a good one is used as it is
    centre, source = agreement_centre(str(tmp_path), targets)
    assert source == "training crops" and torch.equal(centre[0], torch.ones(8)) and torch.equal(centre[1], torch.zeros(8))
