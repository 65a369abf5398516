"""`veca_from_teacher` and `training.distill_veca --init-from-teacher`: a VECA that starts from a DINOv2 / DINOv3
teacher's weights (issue #47)."""

import json
import textwrap

import pytest
import torch
import torch.nn.functional as F
from conftest import load_without_package, nothing_written, veca_args
from transformers import (
    DINOv3ViTConfig,
    DINOv3ViTModel,
    Dinov2Config,
    Dinov2Model,
    Dinov2WithRegistersConfig,
    Dinov2WithRegistersModel,
    ResNetConfig,
    ResNetModel,
)

from corevision_hf import veca_from_teacher
from corevision_hf.convert.vit_teacher import FAMILIES, TEACHER_NAMES
from training import distill_veca

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, patch_size=8, image_size=32)


def randomised(teacher):
    """The teacher with every tensor random (LayerScale too, so that folding it is seen), in eval mode."""
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in teacher.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.5)
    return teacher.eval()


TEACHERS = {
    "dinov2": lambda: Dinov2Model(Dinov2Config(**TINY, mlp_ratio=2)),
    "dinov2_with_registers": lambda: Dinov2WithRegistersModel(
        Dinov2WithRegistersConfig(**TINY, mlp_ratio=2, num_register_tokens=4)),
    "dinov3_vit": lambda: DINOv3ViTModel(DINOv3ViTConfig(**TINY, intermediate_size=64, num_register_tokens=4)),
}


@pytest.fixture(params=sorted(TEACHERS))
def teacher(request):
    return randomised(TEACHERS[request.param]())


def test_every_copied_tensor_is_the_teachers(teacher):
    student = veca_from_teacher(teacher, num_cores=8)
    family = FAMILIES[type(teacher).__name__]
    teacher_modules, copied = dict(teacher.named_modules()), student.config.init_from_teacher["copied"]
    for student_name, teacher_names in TEACHER_NAMES.items():
        for i in range(2) if "{i}" in student_name else [None]:
            teacher_name = teacher_names[family].format(i=i)
            mine, theirs = student.get_submodule(student_name.format(i=i)), teacher_modules[teacher_name]
            layer = teacher_modules[teacher_name.rsplit(".", 2)[0]] if i is not None else None
            x = torch.randn(5, theirs.weight.shape[-1]) if isinstance(theirs, torch.nn.Linear) else None
            with torch.no_grad():
                if student_name.endswith("o_proj"):  # LayerScale folded in
                    torch.testing.assert_close(mine(x), layer.layer_scale1(theirs(x)))
                elif student_name.endswith("fc2"):
                    torch.testing.assert_close(mine(x), layer.layer_scale2(theirs(x)))
                elif not student_name.endswith("fc1"):  # fc1 (half of a SwiGLU): test_the_mlp_is_the_teachers
                    assert torch.equal(mine.weight, theirs.weight), student_name
                    if theirs.bias is not None:
                        assert torch.equal(mine.bias, theirs.bias), student_name
            assert student_name.replace("{i}", "*") + ".weight" in copied
    record = student.config.init_from_teacher
    assert record["new"] == ["core_bank.cores", "core_bank.coordinates", "encoder.coordinate_heads.*.alpha",
                             "encoder.coordinate_heads.*.proj.weight", "encoder.coordinate_heads.*.proj.bias"] + (
        ["encoder.layers.*.attention.k_proj.bias"] if family == 1 else [])  # DINOv3's keys have no bias
    assert "embeddings.cls_token" in record["left_out"] and record["model_type"] == teacher.config.model_type
    assert student.config.layer_norm_eps == teacher.config.layer_norm_eps
    assert student.config.intermediate_size == 64 and student.config.patch_size == 8


def test_the_mlp_is_the_teachers_not_a_random_one(teacher):
    """The SwiGLU started from the teacher's GELU MLP is close to it; a random MLP is not (the check can fail)."""
    student = veca_from_teacher(teacher, num_cores=8)
    layer = (teacher.encoder.layer if hasattr(teacher, "encoder") else teacher.model.layer)[0]
    x = torch.randn(100, 32)
    with torch.no_grad():
        expected = layer.layer_scale2(layer.mlp(x))
        error = (student.encoder.layers[0].mlp(x) - expected).abs().mean() / expected.abs().mean()
        random_error = (type(student)(student.config).encoder.layers[0].mlp(x) - expected).abs().mean()
    assert error < 0.05 and random_error / expected.abs().mean() > 0.5


@pytest.mark.parametrize("name", ["dinov2", "dinov2_with_registers"])
def test_full_budget_outputs_are_finite_and_start_from_the_teachers_patch_embedding(name):
    teacher = randomised(TEACHERS[name]())
    student = veca_from_teacher(teacher, num_cores=8).eval()
    pixel_values = torch.randn(2, 3, 24, 40)
    with torch.no_grad():
        output = student(pixel_values, num_cores=8, output_hidden_states=True)
        patches = teacher.embeddings.patch_embeddings(pixel_values)  # before the teacher adds its positions
    assert output.last_hidden_state.isfinite().all() and output.last_hidden_state.shape == (2, 8 + 15, 32)
    torch.testing.assert_close(output.hidden_states[0][:, 8:], patches, atol=0, rtol=0)


LOADER = textwrap.dedent(
    """
    import torch
    from transformers import AutoModel

    source, inputs_path, outputs_path = sys.argv[1:4]
    model = AutoModel.from_pretrained(source, trust_remote_code=True).eval()
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    with torch.no_grad():
        outputs = {"tokens": model(torch.load(inputs_path), num_cores=8).last_hidden_state}
    outputs["record"] = model.config.init_from_teacher
    torch.save(outputs, outputs_path)
    """
)


def test_saved_and_loaded_by_hub_code_alone(tmp_path):
    student = veca_from_teacher(randomised(TEACHERS["dinov2_with_registers"]()), num_cores=8).eval()
    student.save_pretrained(tmp_path / "veca")
    pixel_values = torch.randn(1, 3, 32, 32)
    outputs = load_without_package(tmp_path, LOADER, str(tmp_path / "veca"), pixel_values)
    with torch.no_grad():
        torch.testing.assert_close(outputs["tokens"], student(pixel_values, num_cores=8).last_hidden_state,
                                   atol=0, rtol=0)
    assert outputs["record"] == student.config.init_from_teacher


def test_refusals(tmp_path):
    with pytest.raises(ValueError, match="plain GELU MLP, not SwiGLU"):
        veca_from_teacher(Dinov2Model(Dinov2Config(**TINY, use_swiglu_ffn=True)))
    with pytest.raises(ValueError, match="plain GELU MLP, not SwiGLU"):
        veca_from_teacher(DINOv3ViTModel(DINOv3ViTConfig(**TINY, intermediate_size=64, use_gated_mlp=True)))
    with pytest.raises(ValueError, match="supports transformers Dinov2Model.*got ResNetModel"):
        veca_from_teacher(ResNetModel(ResNetConfig(embedding_size=8, hidden_sizes=[8], depths=[1])))
    with pytest.raises(ValueError, match=r"takes \['hidden_size'\] from the teacher"):
        veca_from_teacher(Dinov2Model(Dinov2Config(**TINY)), hidden_size=64)
    Dinov2Model(Dinov2Config(**TINY)).save_pretrained(tmp_path / "dinov2")  # a checkpoint without registers
    wrong = Dinov2WithRegistersModel.from_pretrained(tmp_path / "dinov2")  # registers missing, random
    with pytest.raises(ValueError, match=r"lacks \['embeddings.register_tokens'\]"):
        veca_from_teacher(wrong)


def test_a_misspelt_override_is_one_error_naming_it_a_close_field_and_the_fields():
    teacher = Dinov2Model(Dinov2Config(**TINY))
    with pytest.raises(ValueError) as error:
        veca_from_teacher(teacher, num_core=16, rope_thetaa=10.0)
    message = str(error.value)
    assert "'num_core' (did you mean 'num_cores'?)" in message
    assert "'rope_thetaa' (did you mean 'rope_theta'?)" in message
    fields = message.split("It takes ")[1]
    assert "default_num_cores" in fields and "hidden_size" not in fields  # the teacher's shapes are not overrides
    assert veca_from_teacher(teacher, num_cores=16, rope_theta=10.0).config.num_cores == 16


@pytest.mark.parametrize("override, size, said", [
    ({"image_size": 30}, 30, "the override image_size is 30"),
    ({"image_size": 0}, 0, "the override image_size is 0"),
    ({"image_size": -16}, -16, "the override image_size is -16"),
    ({}, 36, "the teacher's image_size is 36"),
])
def test_an_image_size_off_the_patch_grid_is_one_error_saying_what_to_pass(override, size, said):
    teacher = Dinov2Model(Dinov2Config(**{**TINY, "image_size": 36 if not override else 32}))
    with pytest.raises(ValueError) as error:
        veca_from_teacher(teacher, **override)
    near = 8 * max(1, round(size / 8))
    assert str(error.value) == (f"{said}: VECA needs a positive multiple of the teacher's patch size 8; pass "
                                f"image_size={near} (or another multiple of 8).")
    assert veca_from_teacher(teacher, image_size=48).config.image_size == 48


def test_a_teacher_on_the_meta_device_is_one_error():
    with torch.device("meta"):
        teacher = Dinov2Model(Dinov2Config(**TINY))
    with pytest.raises(ValueError, match="on the meta device .*load it with from_pretrained on a real device"):
        veca_from_teacher(teacher, num_cores=8)


def test_distill_veca_init_from_teacher_runs_and_records_it(teacher_dir, image_dir, tmp_path, capsys):
    distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path, "--init-from-teacher", "--config-overrides",
                                '{"num_cores": 8}', "--max-steps", "2"))
    printed = capsys.readouterr().out
    assert "copied from the teacher: patch_embeddings.projection.weight" in printed
    assert "new: core_bank.cores" in printed
    assert json.loads((tmp_path / "run.json").read_text())["args"]["init_from_teacher"] is True
    with open(tmp_path / "final" / "config.json") as f:
        assert json.load(f)["init_from_teacher"]["copied"][0] == "patch_embeddings.projection.weight"


def test_distill_veca_refuses_init_from_teacher_with_init_from(teacher_dir, image_dir, tmp_path):
    with pytest.raises(ValueError, match="choose one"):
        distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path / "out", "--init-from-teacher", "--init-from",
                                    str(tmp_path), "--max-steps", "1"))
    assert nothing_written(tmp_path / "out")


def test_gelu_scale_is_the_sigmoid_approximation():
    from corevision_hf.convert.vit_teacher import GELU_SCALE

    z = torch.linspace(-8, 8, 2001)
    assert (F.silu(GELU_SCALE * z) / GELU_SCALE - F.gelu(z)).abs().max() < 0.021


def test_a_run_from_before_the_flag_resumes_with_it_off_only(tmp_path):
    from training.checkpointing import check_output_dir

    now = vars(distill_veca.parse_args(["--teacher", "t", "--data", "d", "--output-dir", str(tmp_path),
                                        "--max-steps", "9", "--resume"]))
    old = {name: value for name, value in now.items() if name != "init_from_teacher"}
    (tmp_path / "run.json").write_text(json.dumps({"script": "training.distill_veca", "args": {**old, "resume": False},
                                                   "num_processes": 1}))
    check_output_dir(str(tmp_path), {"script": "training.distill_veca", "args": now, "num_processes": 1})
    with pytest.raises(ValueError, match="--init-from-teacher was False"):
        check_output_dir(str(tmp_path), {"script": "training.distill_veca", "args": {**now, "init_from_teacher": True},
                                         "num_processes": 1})
