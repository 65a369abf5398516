"""training.validation: agreement with the teacher on held-out images, over a grid of budgets and resolutions."""

import re
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_veca_config
from PIL import Image
from transformers import AutoModel

from corevision_hf import VecaModel, lookwhere_from_teacher
from corevision_hf.images import to_pixel_values
from training.data import resize_center_crop
from training.validation import HeldOutAgreement


@pytest.fixture(scope="module")
def teacher(teacher_dir):
    return AutoModel.from_pretrained(teacher_dir).eval()


@pytest.fixture
def veca():
    torch.manual_seed(0)
    return VecaModel(tiny_veca_config(output_projection_size=32))  # width 64 -> the teacher's 32


class TeacherAsStudent(torch.nn.Module):
    """The teacher's own tokens in LookWhere's layout: [CLS, registers; patches], pooler = CLS."""

    def __init__(self, teacher):
        super().__init__()
        self.teacher, self.config = teacher, teacher.config

    def forward(self, pixel_values, k=None):
        hidden = self.teacher(pixel_values).last_hidden_state
        return types.SimpleNamespace(last_hidden_state=hidden, pooler_output=hidden[:, 0])


def test_cells_match_a_hand_computation_in_eval_mode_and_the_mode_is_restored(teacher, veca, image_dir):
    veca.train()  # in train mode VECA shifts its patch coordinates at random: the hand computation would not match
    teacher_calls = []
    hook = teacher.register_forward_hook(lambda *args: teacher_calls.append(1))
    try:
        result = HeldOutAgreement(image_dir, "num_cores", [2, 8], [16, 32], batch_size=2, max_images=5)(veca, teacher)
    finally:
        hook.remove()
    assert veca.training and all(module.training for module in veca.modules())
    assert len(teacher_calls) == 2 * 3  # once per batch and resolution, not once per budget

    files = sorted(Path(image_dir).rglob("*.jpg"))[:5]  # the first five, in order; batch 2 leaves one of one
    veca.eval()
    expected = []
    with torch.no_grad():
        for resolution in [16, 32]:
            pixel_values = torch.stack([to_pixel_values(resize_center_crop(Image.open(f), resolution)) for f in files])
            hidden = teacher(pixel_values).last_hidden_state
            num_patches = (resolution // 8) ** 2
            for num_cores in [2, 8]:
                output = veca(pixel_values, num_cores=num_cores)
                cls = F.cosine_similarity(output.pooler_output, hidden[:, 0], dim=-1).mean()
                patches = F.cosine_similarity(output.last_hidden_state[:, num_cores:], hidden[:, -num_patches:], dim=-1)
                expected.append({"resolution": resolution, "num_cores": num_cores, "images": 5,
                                 "cls_cosine": cls.item(), "patch_cosine": patches.mean().item()})
    assert [(row["resolution"], row["num_cores"], row["images"]) for row in result["grid"]] == [
        (row["resolution"], row["num_cores"], row["images"]) for row in expected
    ]
    for row, hand in zip(result["grid"], expected):
        assert row["cls_cosine"] == pytest.approx(hand["cls_cosine"], abs=1e-5)
        assert row["patch_cosine"] == pytest.approx(hand["patch_cosine"], abs=1e-5)
    mean = sum(row["cls_cosine"] + row["patch_cosine"] for row in expected) / (2 * len(expected))
    assert result["score"] == pytest.approx(mean, abs=1e-5)


def test_the_teacher_scores_one_and_an_untrained_student_less(teacher, image_dir):
    validate = HeldOutAgreement(image_dir, "k", [2, 8], [32], batch_size=4, max_images=8)
    perfect = validate(TeacherAsStudent(teacher).eval(), teacher)
    assert perfect["score"] == pytest.approx(1.0, abs=1e-6)
    assert all(row["cls_cosine"] == pytest.approx(1.0, abs=1e-6) for row in perfect["grid"])
    student = lookwhere_from_teacher(teacher, selector_depth=1, selector_image_size=16).eval()
    untrained = validate(student, teacher)
    assert untrained["score"] < 0.99
    assert [row["k"] for row in untrained["grid"]] == [2, 8] and all(row["images"] == 8 for row in untrained["grid"])


class MeanTokenStudent(torch.nn.Module):
    """Outputs the centre for every token: the constant predictor the centred measures must not reward."""

    def __init__(self, teacher, centre):
        super().__init__()
        self.teacher, self.config, self.centre = teacher, teacher.config, centre

    def forward(self, pixel_values, k=None):
        hidden = self.teacher(pixel_values).last_hidden_state
        tokens = self.centre[1].expand_as(hidden).clone()
        tokens[:, 0] = self.centre[0]
        return types.SimpleNamespace(last_hidden_state=tokens, pooler_output=tokens[:, 0])


def test_with_a_centre_the_score_is_the_centred_cosine_the_mean_token_scores_0_and_r2_is_pooled(teacher, image_dir):
    validate = HeldOutAgreement(image_dir, "k", [4], [32], batch_size=3, max_images=8)
    files = sorted(Path(image_dir).rglob("*.jpg"))[:8]
    with torch.no_grad():
        pixel_values = torch.stack([to_pixel_values(resize_center_crop(Image.open(f), 32)) for f in files])
        hidden = teacher(pixel_values).last_hidden_state
    centre = (hidden[:, 0].mean(0), hidden[:, -16:].mean((0, 1)))  # these images' own mean tokens
    mean_token = validate(MeanTokenStudent(teacher, centre).eval(), teacher, centre)
    row = mean_token["grid"][0]
    assert mean_token["score_measure"] == "centred cosine" and mean_token["score"] == 0
    assert row["cls_centred_cosine"] == row["patch_centred_cosine"] == 0
    assert row["cls_r2"] == pytest.approx(0, abs=1e-5) and row["patch_r2"] == pytest.approx(0, abs=1e-5)
    assert row["patch_cosine"] > 0.3  # the raw cosine rewards it (this tiny random teacher: 0.48)
    assert validate(MeanTokenStudent(teacher, centre).eval(), teacher)["score_measure"] == "cosine"

    shrunk = (hidden[:, -16:] - centre[1]) * 0.5 + centre[1]  # half-way to the centre: R^2 = 1 - 0.25 by hand
    class Shrunk(TeacherAsStudent):
        def forward(self, pixel_values, k=None):
            output = super().forward(pixel_values)
            tokens = output.last_hidden_state.clone()
            tokens[:, -16:] = (tokens[:, -16:] - centre[1]) * 0.5 + centre[1]
            return types.SimpleNamespace(last_hidden_state=tokens, pooler_output=tokens[:, 0])
    row = validate(Shrunk(teacher).eval(), teacher, centre)["grid"][0]
    sse = (shrunk - hidden[:, -16:]).square().sum()
    sst = (hidden[:, -16:] - centre[1]).square().sum()
    assert row["patch_r2"] == pytest.approx((1 - sse / sst).item(), abs=1e-5)
    assert row["patch_r2"] == pytest.approx(0.75, abs=1e-5) and row["cls_r2"] == pytest.approx(1, abs=1e-6)
    assert row["patch_centred_cosine"] == pytest.approx(1, abs=1e-5)


def test_two_processes_share_the_images_and_reduce_to_one_process_numbers(teacher, veca, image_dir):
    veca.eval()
    shares = {}

    def as_process(process_index, max_images):
        """Process `process_index` of two; process 1 runs first and process 0's reduce adds its sums."""
        def reduce(tensor, reduction):
            assert reduction == "sum"
            shares[process_index] = tensor
            return tensor if process_index == 1 else tensor + shares[1]

        accelerator = types.SimpleNamespace(process_index=process_index, num_processes=2, reduce=reduce)
        validate = HeldOutAgreement(image_dir, "num_cores", [4], [32], batch_size=3, max_images=max_images,
                                    accelerator=accelerator)
        return validate(veca, teacher)

    single = HeldOutAgreement(image_dir, "num_cores", [4], [32], batch_size=3, max_images=8)(veca, teacher)
    as_process(1, 8)
    both = as_process(0, 8)
    assert shares[0][0, 0, 2] == shares[1][0, 0, 2] == 4  # four images each
    assert both["grid"][0]["images"] == 8
    assert both["score"] == pytest.approx(single["score"], abs=1e-6)
    as_process(1, 4)
    assert as_process(0, 4)["grid"][0]["images"] == 4  # max_images counts the images of all processes


def test_a_folder_without_readable_images_is_one_clear_error(teacher, veca, tmp_path):
    for i in range(3):
        (tmp_path / f"{i}.jpg").write_bytes(b"not an image")
    with pytest.raises(ValueError, match=re.escape(f"The held-out images {tmp_path} hold no readable image")):
        HeldOutAgreement(str(tmp_path), "num_cores", [2], [32], batch_size=2)(veca, teacher)


def test_a_resolution_off_the_patch_grid_is_named(teacher, veca, image_dir):
    with pytest.raises(ValueError, match="resolution 36 is not a multiple of the student's patch size 8"):
        HeldOutAgreement(image_dir, "num_cores", [2], [32, 36], batch_size=2)(veca, teacher)
