"""evaluation.task_student: the selector's map-only phase, and what the distillation after it trains."""

import json

import torch
from conftest import save_task_teacher
from transformers import Dinov2Model

from benchmarks import sparse_recognition as sr
from corevision_hf import LookWhereModel, lookwhere_from_teacher
from corevision_hf.lookwhere.budget_lookwhere import kept_for_ratio
from evaluation.canvases import CanvasDataset, task_splits
from evaluation.sparse_digits import CELL
from evaluation.task_student import TRAIN_K_RATIOS, distil_student, fit_selector_map
from evaluation.teacher_passes import TeacherPasses, pass_record
from training.data import DataStats


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
    joint, _, after_map = distilled("--joint-selector", "--extractor-prefix", "selector")
    assert not same(joint, after_map, "selector.")
    copied, start, after_map = distilled("--steps", "0", "--extractor-prefix", "extractor")
    assert copied.config.extractor_prefix == "extractor"
    assert same(copied, after_map, "selector.") and same(copied, start, "extractor.")
    saved = LookWhereModel.from_pretrained(str(tmp_path / "scratch" / "final")).float()  # what make tasks' card reads
    assert same(saved, copied, "") and [p.name for p in (tmp_path / "scratch").glob("[!.]*")] == ["final"]
    recipe = json.loads((tmp_path / "scratch" / "final" / "training_recipe.json").read_text())
    assert (recipe["steps"], recipe["args"]["k_max"], recipe["args"]["extractor_prefix"]) == (
        0, kept_for_ratio(TRAIN_K_RATIOS[1], 64), "extractor")  # the smoke canvas: 8 x 8 cells
