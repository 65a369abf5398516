"""The conversion of a pretrained ViT into an elastic VECA (training.conversion, training.convert_veca): the per-block
table measures what it says, each stage trains what it says, and the command converts a tiny teacher end to end."""

import json

import pytest
import torch
from transformers import Dinov2Config, Dinov2Model

from corevision_hf import VecaModel, veca_from_teacher
from training import conversion, convert_veca

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, patch_size=8,
            image_size=32)


def teacher() -> Dinov2Model:
    torch.manual_seed(0)
    model = Dinov2Model(Dinov2Config(**TINY)).eval()
    with torch.no_grad():  # LayerScale and biases away from their init, so that folding or dropping them shows
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    return model


def images(count: int = 2, size: int = 32, seed: int = 1) -> torch.Tensor:
    return torch.randn(count, 3, size, size, generator=torch.Generator().manual_seed(seed))


def test_the_teachers_targets_are_its_blocks_inputs_and_attention_branches():
    """Each block's input plus its recorded attention branch plus its MLP branch is the next block's input (at the
    patch positions), computed here from the teacher's own modules."""
    model, pixel_values = teacher(), images()
    targets = conversion.teacher_targets(model, pixel_values)
    assert len(targets["inputs"]) == 3 and len(targets["branches"]) == 2 and targets["grid"] == (4, 4)
    with torch.no_grad():
        for index, block in enumerate(model.encoder.layer):
            hidden = targets["inputs"][index]
            after_attention = hidden + block.layer_scale1(block.attention(block.norm1(hidden))[0])
            torch.testing.assert_close(after_attention[:, 1:] - hidden[:, 1:], targets["branches"][index])
            expected = after_attention + block.layer_scale2(block.mlp(block.norm2(after_attention)))
            torch.testing.assert_close(targets["inputs"][index + 1], expected, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_with_every_patch_its_own_region_the_pooled_bound_is_the_teachers_attention_over_its_patches():
    """The pass's wiring (the copy's norm, q / k / v, o_proj with LayerScale folded in, the cores before the patches):
    with C = N regions of one patch each and no rotation, each patch attends to exactly the teacher's patch tokens,
    which is the teacher's attention with its CLS masked out, computed here by hand."""
    model, pixel_values = teacher(), images()
    student = veca_from_teacher(model, num_cores=16, rope_zero_fraction=1.0).eval()
    targets = conversion.teacher_targets(model, pixel_values)
    ours = conversion.transfer_pass(student, targets, 16, pooled_cores=True)
    for index, block in enumerate(model.encoder.layer):
        normed = block.norm1(targets["inputs"][index])[:, 1:]
        attention = block.attention
        heads = lambda x: x.unflatten(-1, (2, 16)).transpose(1, 2)  # noqa: E731
        query, key, value = (heads(projection(normed)) for projection in
                             (attention.q_proj, attention.k_proj, attention.v_proj))
        mixed = (torch.softmax(query @ key.transpose(-1, -2) / 4, dim=-1) @ value).transpose(1, 2).flatten(2)
        torch.testing.assert_close(ours[index], block.layer_scale1(attention.o_proj(mixed)), atol=1e-5, rtol=1e-5)


def test_the_errors_read_one_for_a_zeroed_branch_and_zero_for_the_teachers_own():
    theirs = torch.randn(2, 16, 32)
    assert conversion.branch_error(torch.zeros_like(theirs), theirs).item() == pytest.approx(1.0)
    assert conversion.branch_error(theirs, theirs).item() == 0.0
    table = conversion.transfer_errors(veca_from_teacher(teacher(), num_cores=8), conversion.teacher_targets(
        teacher(), images()), [2, 8])
    assert set(table) == {"uniform", "student_c2", "pooled_bound_c2", "student_c8", "pooled_bound_c8"}
    assert all(len(values) == 2 and all(value >= 0 for value in values) for values in table.values())
    assert "mean" in conversion.format_table(table)


def test_the_bank_is_seeded_from_the_teachers_tokens_in_nested_order():
    model = teacher()
    student = veca_from_teacher(model, num_cores=6)
    record = conversion.seed_core_bank(student, model, [images(2), images(2, seed=2)])
    assert record == {"from_teacher_tokens": 1, "centroids": 5, "tokens_clustered": 64}
    with torch.no_grad():
        cls = model.embeddings(images(1))[0, 0]  # the CLS with its position, the same for every image
    torch.testing.assert_close(student.embeddings.core_bank.cores[0, 0], cls)
    assert student.embeddings.core_bank.coordinates.abs().max() < 2  # atanh of points inside (-0.95, 0.95)


def test_nested_order_puts_first_what_lowers_the_error_most():
    """Points at 0 (ten of them), 10 (five) and 11 (one), candidates at each: beside nothing chosen, the one at 0
    serves the most points first, then the one at 10, then 11."""
    points = torch.tensor([[0.0]] * 10 + [[10.0]] * 5 + [[11.0]])
    candidates = torch.tensor([[11.0], [10.0], [0.0]])
    assert conversion.nested_order(points, candidates, torch.zeros(0, 1)) == [2, 1, 0]
    assert conversion.nested_order(points, candidates, torch.tensor([[0.0]])) == [1, 0, 2]


def test_stage_one_trains_the_bank_and_coordinate_heads_alone_and_lowers_the_error():
    model, pixel_values = teacher(), images(4)
    student = veca_from_teacher(model, num_cores=8)
    copied = {name: value.clone() for name, value in student.state_dict().items()
              if "core_bank" not in name and "coordinate_heads" not in name}
    targets = conversion.teacher_targets(model, pixel_values)
    before = conversion.transfer_loss(student, targets, 8).item()
    conversion.attention_transfer(student, model, lambda step: pixel_values, 30, 1e-2, log=lambda line: None)
    assert conversion.transfer_loss(student, targets, 8).item() < 0.8 * before
    assert all(torch.equal(student.state_dict()[name], value) for name, value in copied.items())
    assert all(parameter.requires_grad for parameter in student.parameters())


@pytest.mark.parametrize("lora_rank", [None, 2])
def test_stage_two_lowers_its_loss_and_gives_a_plain_veca(lora_rank):
    model, pixel_values = teacher(), images(4)
    student = veca_from_teacher(model, num_cores=8)
    targets = conversion.teacher_targets(model, pixel_values)
    before = conversion.end_to_end_loss(student, targets, pixel_values, 8).item()
    snapshots = []
    student, losses = conversion.end_to_end(student, model, lambda step: pixel_values, 20, 3e-3, lora_rank=lora_rank,
                                            log=lambda line: None,
                                            after_step=lambda done, snapshot: snapshots.append((done, snapshot())))
    assert type(student) is VecaModel and len(losses) == 20
    with torch.no_grad():
        after = conversion.end_to_end_loss(student, targets, pixel_values, 8).item()
        assert after < 0.9 * before
        done, last = snapshots[-1]
        assert done == 20 and type(last) is VecaModel
        torch.testing.assert_close(last(pixel_values).last_hidden_state, student(pixel_values).last_hidden_state)


def test_the_command_converts_a_tiny_teacher_and_records_every_stage(teacher_dir, image_dir, tmp_path, capsys):
    out = tmp_path / "run"
    convert_veca.main(["--teacher", teacher_dir, "--data", image_dir, "--image-size", "32", "--num-cores", "8",
                       "--stage1-steps", "2", "--stage2-steps", "2", "--output-dir", str(out)])
    record = json.loads((out / "conversion.json").read_text())
    assert list(record["stages"]) == ["start", "stage1", "stage2"]
    assert set(record["stages"]["stage2"]["transfer_error"]) >= {"uniform", "student_c8", "pooled_bound_c8"}
    assert record["conversion_time_s"] > 0 and len(record["stages"]["stage1"]["losses"]) == 2
    assert VecaModel.from_pretrained(out / "final").config.num_cores == 8
    printed = capsys.readouterr().out
    assert printed.count("mean") == 3 and "conversion took" in printed


@pytest.mark.parametrize("flags, message", [
    (["--image-size", "30"], "not a multiple of the teacher's patch size 8"),
    (["--stage1-steps", "-1"], "--stage1-steps must be 0 or more"),
    (["--num-cores", "0"], "--num-cores must be positive"),
])
def test_bad_arguments_are_one_line(teacher_dir, image_dir, tmp_path, capsys, flags, message):
    from corevision_hf.cli import run

    argv = ["--teacher", teacher_dir, "--data", image_dir, "--output-dir", str(tmp_path / "run"), *flags]
    assert run(convert_veca.main, argv) == 2
    assert message in capsys.readouterr().err


def test_an_output_folder_with_anything_in_it_is_refused(teacher_dir, image_dir, tmp_path, capsys):
    from corevision_hf.cli import run

    (tmp_path / "notes.txt").write_text("mine")
    assert run(convert_veca.main, ["--teacher", teacher_dir, "--data", image_dir, "--output-dir", str(tmp_path)]) == 2
    assert "not an empty folder" in capsys.readouterr().err and (tmp_path / "notes.txt").read_text() == "mine"


def test_convert_reports_each_point_of_the_conversion_and_reads_its_images_by_rows():
    """`convert`'s after_step: the start once the bank is seeded (the copy, its bank seeded as `seed_core_bank` seeds
    it), the end of stage 1, each step of stage 2 (the last is the returned student), each snapshot a plain VecaModel;
    the copy draws the budgets it is given; images given by rows (as evaluation.canvases' Pixels gives them) convert
    to the same bits as the tensor."""
    from types import SimpleNamespace

    model, train, val = teacher(), images(6), images(2, seed=3)
    args = SimpleNamespace(num_cores=8, batch_size=2, stage1_steps=2, stage1_lr=1e-2, stage2_steps=3, stage2_lr=1e-3,
                           lora_rank=0, seed=0)
    seen = []
    student, record = conversion.convert(model, train, val, args, log=lambda line: None, budgets=[4, 8],
                                         after_step=lambda stage, steps, snapshot: seen.append((stage, steps,
                                                                                                snapshot())))
    assert [(stage, steps) for stage, steps, _ in seen] == [("start", 0), ("stage1", 2), ("stage2", 1), ("stage2", 2),
                                                            ("stage2", 3)]
    assert all(type(snapshot) is VecaModel for *_, snapshot in seen) and student.config.training_budgets == [4, 8]
    torch.manual_seed(0)
    start = veca_from_teacher(model, num_cores=8, image_size=32, training_budgets=[4, 8]).float()
    conversion.seed_core_bank(start, model, train.split(2), seed=0)
    assert all(torch.equal(value, seen[0][2].state_dict()[key]) for key, value in start.state_dict().items())
    assert all(torch.equal(value, seen[-1][2].state_dict()[key]) for key, value in student.state_dict().items())
    assert list(record["stages"]) == ["start", "stage1", "stage2"] and record["conversion_time_s"] > 0

    class Rows:  # no tensor: a length and rows
        def __len__(self):
            return len(train)

        def __getitem__(self, rows):
            return train[rows]

    again, _ = conversion.convert(model, Rows(), val, args, log=lambda line: None, budgets=[4, 8])
    assert all(torch.equal(value, again.state_dict()[key]) for key, value in student.state_dict().items())
