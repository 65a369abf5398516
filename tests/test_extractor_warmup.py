"""training.extractor_warmup: LookWhere's extractor frozen for --freeze-extractor-steps, then its rate ramping up."""

import argparse
import json

import pytest
import torch
from conftest import launch_two_processes, lookwhere_args, veca_args
from safetensors.torch import load_file

from training import distill_lookwhere, distill_veca, loop
from training.extractor_warmup import ExtractorWarmup, extractor_lr_scale
from training.schedule import warmup_cosine


def test_the_extractor_scale_is_0_while_frozen_then_ramps_to_1():
    assert [extractor_lr_scale(step, 2, 4) for step in range(8)] == [0, 0, 0.25, 0.5, 0.75, 1, 1, 1]
    assert [extractor_lr_scale(step, 1, 0) for step in range(3)] == [0, 1, 1]


def test_any_run_args_can_ask_for_it_and_the_ramp_defaults_to_the_warm_up():
    assert ExtractorWarmup.from_args(argparse.Namespace(warmup_steps=7), True) is None  # no such attribute: off
    warmup = ExtractorWarmup.from_args(argparse.Namespace(warmup_steps=7, freeze_extractor_steps=3), False)
    assert (warmup.freeze_steps, warmup.warmup_steps, warmup.single_process) == (3, 7, False)
    with pytest.raises(ValueError, match="must be >= 0"):
        ExtractorWarmup.from_args(argparse.Namespace(warmup_steps=7, freeze_extractor_steps=-1), True)


def record_steps(monkeypatch) -> list[dict]:
    """Before every optimisation step: the extractor's and the selector's weights and each group's learning rate."""
    records, train_step = [], loop.train_step

    def spy(accelerator, args, student, optimizer, *rest, **kwargs):
        model = accelerator.unwrap_model(student)
        records.append({
            "extractor": {n: p.detach().clone() for n, p in model.extractor.named_parameters()},
            "selector": {n: p.detach().clone() for n, p in model.selector.named_parameters()},
            "lrs": {g["extractor"]: g["lr"] for g in optimizer.param_groups},
        })
        return train_step(accelerator, args, student, optimizer, *rest, **kwargs)

    monkeypatch.setattr(loop, "train_step", spy)
    return records


def equal(a: dict, b: dict) -> bool:
    return all(torch.equal(a[name], b[name]) for name in a)


def test_the_extractor_stays_bit_identical_while_frozen_then_moves_with_its_ramp(teacher_dir, image_dir, tmp_path,
                                                                                 monkeypatch):
    records = record_steps(monkeypatch)
    distill_lookwhere.main(lookwhere_args(teacher_dir, image_dir, tmp_path, "--max-steps", "5", "--warmup-steps", "1",
                                          "--lr", "1e-3", "--freeze-extractor-steps", "2",
                                          "--extractor-warmup-steps", "2"))
    final = load_file(tmp_path / "final" / "model.safetensors")
    after = [record["extractor"] for record in records[1:]] + [
        {name: final[f"extractor.{name}"] for name in records[0]["extractor"]}]
    assert equal(records[0]["extractor"], after[0]) and equal(records[0]["extractor"], after[1])  # steps 0, 1
    moved = ("norm.weight", "layers.0.mlp.fc1.weight")
    assert not any(torch.equal(records[0]["extractor"][n], after[2][n]) for n in moved)
    assert not equal(records[1]["selector"], records[2]["selector"])  # the selector trains meanwhile (step 0: lr 0)
    for step, record in enumerate(records):
        lr = 1e-3 * warmup_cosine(step, 1, 5, 0.0)
        assert record["lrs"][False] == pytest.approx(lr)
        assert record["lrs"][True] == pytest.approx(lr * [0, 0, 0.5, 1, 1][step])
    recipe = json.loads((tmp_path / "final" / "training_recipe.json").read_text())
    assert recipe["args"]["freeze_extractor_steps"] == 2 and recipe["args"]["extractor_warmup_steps"] == 2


def test_the_ramp_applies_without_a_frozen_phase(teacher_dir, image_dir, tmp_path, monkeypatch):
    warmup = ExtractorWarmup.from_args(argparse.Namespace(warmup_steps=7, freeze_extractor_steps=0,
                                                          extractor_warmup_steps=3), True)
    assert (warmup.freeze_steps, warmup.warmup_steps) == (0, 3)
    records = record_steps(monkeypatch)
    distill_lookwhere.main(lookwhere_args(teacher_dir, image_dir, tmp_path, "--max-steps", "4", "--lr", "1e-3",
                                          "--extractor-warmup-steps", "2"))
    for step, record in enumerate(records):
        lr = 1e-3 * warmup_cosine(step, 0, 4, 0.0)
        assert record["lrs"][False] == pytest.approx(lr)
        assert record["lrs"][True] == pytest.approx(lr * [0.5, 1, 1, 1][step])
    assert not equal(records[0]["extractor"], records[1]["extractor"])  # nothing frozen: it trains from step 0


def test_a_resume_inside_the_frozen_phase_gives_the_uninterrupted_weights(teacher_dir, image_dir, tmp_path):
    common = ["--max-steps", "5", "--checkpoint-every", "1", "--freeze-extractor-steps", "3", "--lr", "1e-3"]
    distill_lookwhere.main(lookwhere_args(teacher_dir, image_dir, tmp_path / "straight", *common))
    distill_lookwhere.main(lookwhere_args(teacher_dir, image_dir, tmp_path / "resumed", *common, "--stop-at-step", "2"))
    distill_lookwhere.main(lookwhere_args(teacher_dir, image_dir, tmp_path / "resumed", *common, "--resume"))
    straight = load_file(tmp_path / "straight" / "final" / "model.safetensors")
    resumed = load_file(tmp_path / "resumed" / "final" / "model.safetensors")
    for name, tensor in straight.items():
        torch.testing.assert_close(resumed[name], tensor, atol=0, rtol=0, msg=name)


@pytest.mark.slow
def test_under_ddp_the_frozen_extractor_stays_bit_identical_too(teacher_dir, image_dir, tmp_path):
    """Two gloo processes (DDP synchronises every gradient, so nothing stops requiring one): after 2 frozen steps (the
    checkpoint of step 2; a run must train its extractor after them) the extractor equals one process's, which the
    test above shows is the starting copy; the selector has trained."""
    common = ["--max-steps", "3", "--freeze-extractor-steps", "2", "--lr", "1e-3", "--checkpoint-every", "2",
              "--keep-checkpoints", "2"]
    two_args = lookwhere_args(teacher_dir, image_dir, tmp_path / "two", *common)
    launch_two_processes(tmp_path, "training.distill_lookwhere", two_args)
    distill_lookwhere.main(lookwhere_args(teacher_dir, image_dir, tmp_path / "one", *common))
    two = load_file(tmp_path / "two" / "checkpoints" / "checkpoint_2" / "model.safetensors")
    one = load_file(tmp_path / "one" / "checkpoints" / "checkpoint_2" / "model.safetensors")
    assert all(torch.equal(two[name], one[name]) for name in one if name.startswith("extractor."))
    assert not all(torch.equal(two[name], one[name]) for name in one if name.startswith("selector."))


def test_a_student_without_an_extractor_is_refused(teacher_dir, image_dir, tmp_path, monkeypatch):
    parse_args = distill_veca.parse_args
    monkeypatch.setattr(distill_veca, "parse_args", lambda argv: _with_freeze(parse_args(argv)))
    with pytest.raises(ValueError, match="no LookWhere extractor"):
        distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path, "--max-steps", "1"))


def _with_freeze(args):
    args.freeze_extractor_steps = 1  # as evaluation/quality_training.py sets extra attributes on its run_args
    return args
