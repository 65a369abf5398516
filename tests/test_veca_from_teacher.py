"""`veca_from_teacher` and `training.distill_veca --init-from-teacher`: a VECA that starts from a DINOv2 / DINOv3
teacher's weights (issue #47), a faithful copy (issue #58): DINOv3's rotated q . k, DINOv2's positions, the teacher's
MLP exactly."""

import json
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode
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
from transformers.models.dinov3_vit.modeling_dinov3_vit import apply_rotary_pos_emb

from corevision_hf import VecaConfig, VecaModel, veca_flops, veca_from_teacher
from corevision_hf.convert import vit_teacher
from corevision_hf.convert.vit_teacher import FAMILIES, TEACHER_NAMES, rope_permutation
from corevision_hf.veca.modeling_veca import apply_rotary
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
    rows = rope_permutation(16) if family == 1 else torch.arange(16)  # DINOv3's q / k rows reordered per head
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
                elif student_name.endswith(("q_proj", "k_proj")):
                    torch.testing.assert_close(mine(x), theirs(x).unflatten(-1, (2, 16))[..., rows].flatten(-2),
                                               atol=0, rtol=0)
                else:
                    assert torch.equal(mine.weight, theirs.weight), student_name
                    if theirs.bias is not None:
                        assert torch.equal(mine.bias, theirs.bias), student_name
            assert student_name.replace("{i}", "*") + ".weight" in copied
    record = student.config.init_from_teacher
    assert record["new"] == ["embeddings.core_bank.cores", "embeddings.core_bank.coordinates",
                             "encoder.coordinate_heads.*.alpha", "encoder.coordinate_heads.*.proj.weight",
                             "encoder.coordinate_heads.*.proj.bias"] + (
        ["encoder.layers.*.attention.k_proj.bias"] if family == 1 else [])  # DINOv3's keys have no bias
    assert "embeddings.cls_token" in record["left_out"] and record["model_type"] == teacher.config.model_type
    assert ("embeddings.position_embeddings" in copied) == (family == 0)
    assert "embeddings.position_embeddings" not in record["left_out"]
    assert student.config.layer_norm_eps == teacher.config.layer_norm_eps
    assert student.config.intermediate_size == 64 and student.config.patch_size == 8
    assert student.config.mlp_type == "plain" and student.config.hidden_act == teacher.config.hidden_act


def test_the_mlp_is_the_teachers_exactly_and_a_random_one_is_not(teacher):
    """The copy's plain MLP gives the teacher's MLP output (LayerScale folded in) to float32 rounding; a random MLP of
    the same shape does not (the check can fail), nor does the SwiGLU mapping (`mlp_type="swiglu"`), which only
    approximates GELU."""
    layer = (teacher.encoder.layer if hasattr(teacher, "encoder") else teacher.model.layer)[0]
    x = torch.randn(100, 32)
    with torch.no_grad():
        expected = layer.layer_scale2(layer.mlp(x))
        student = veca_from_teacher(teacher, num_cores=8)
        torch.testing.assert_close(student.encoder.layers[0].mlp(x), expected)
        random_error = (type(student)(student.config).encoder.layers[0].mlp(x) - expected).abs().mean()
        swiglu = veca_from_teacher(teacher, num_cores=8, mlp_type="swiglu").encoder.layers[0].mlp(x)
    scale = expected.abs().mean()
    assert random_error / scale > 0.5
    assert 1e-3 < (swiglu - expected).abs().mean() / scale < 0.05  # close, not exact: u * sigmoid(1.702 u)


def test_the_plain_mlp_costs_4_l_d_h_by_hand_and_by_torchs_counter():
    """veca_flops counts the plain MLP as two matrix products, 4 L d h, and a SwiGLU of the same h as 6 L d h; a hand
    count of a tiny model (32 px, patch 8: N = 16 patches, C = 8 cores, L = 24 tokens, d = 32, h = 64, 2 blocks) and
    torch's FLOP counter on the block's MLP agree."""
    plain = VecaConfig(**TINY, intermediate_size=64, num_cores=8, mlp_type="plain")
    swiglu = VecaConfig(**TINY, intermediate_size=64, num_cores=8)
    projections, attention, mlp = 8 * 24 * 32 * 32, 4 * 32 * (8 * 8 + 2 * 16 * 8), 4 * 24 * 32 * 64
    coordinate_heads, patch_embedding = 1 * 2 * 8 * 32 * 2, 2 * 16 * 32 * 3 * 8 * 8
    by_hand = 2 * (projections + attention + mlp) + coordinate_heads + patch_embedding
    assert veca_flops(plain, 32, num_cores=8) == by_hand
    assert veca_flops(swiglu, 32, num_cores=8) - veca_flops(plain, 32, num_cores=8) == 2 * 2 * 24 * 32 * 64
    for config, per_token in ((plain, 4), (swiglu, 6)):
        with FlopCounterMode(display=False) as counter:
            VecaModel(config).encoder.layers[0].mlp(torch.randn(1, 24, 32))
        assert counter.get_total_flops() == per_token * 24 * 32 * 64


def teacher_logits(teacher, hidden_states, grid):
    """DINOv3's attention logits between patch tokens, q . k after its RoPE, of block 0: (1, heads, N, N)."""
    attention = teacher.model.layer[0].attention
    cos, sin = teacher.rope_embeddings(torch.empty(1, 3, grid[0] * 8, grid[1] * 8))
    shape = (1, -1, attention.num_heads, attention.head_dim)
    query, key = (proj(hidden_states).view(shape).transpose(1, 2) for proj in (attention.q_proj, attention.k_proj))
    query, key = apply_rotary_pos_emb(query, key, cos, sin)
    return query @ key.transpose(-1, -2)


def student_logits(student, hidden_states, grid):
    """The same logits in the VECA copy: its q / k, rotated by VECA's RoPE at the patch centres."""
    attention = student.encoder.layers[0].attention
    rotations = student.encoder.rotary_embedding.eval()(grid)
    shape = (1, hidden_states.shape[1], attention.num_heads, attention.head_dim)
    query_key = torch.stack([proj(hidden_states).view(shape) for proj in (attention.q_proj, attention.k_proj)], 2)
    query, key = (x.transpose(1, 2) for x in apply_rotary(query_key, rotations).unbind(2))
    return query @ key.transpose(-1, -2)


@pytest.mark.parametrize("grid", [(4, 4), (3, 5), (7, 6)])
def test_dinov3_rotated_logits_between_patches_are_the_teachers(grid, monkeypatch):
    """Between any two patches of the grid (the teacher's own 4 x 4, and others), the copy's q . k under VECA's RoPE is
    DINOv3's under its own, per head (width 64, head_dim 32: 8 frequencies per axis). Without the per-head reordering
    of the q / k rows, or with VECA's default zeroed frequencies (the lowest of the 8), they are not (the test can
    fail)."""
    teacher = randomised(DINOv3ViTModel(DINOv3ViTConfig(**{**TINY, "hidden_size": 64}, intermediate_size=64,
                                                        num_register_tokens=4)))
    teacher.config.rope_theta = teacher.rope_embeddings.base = 7.0  # a base of the teacher's own, followed
    teacher.rope_embeddings.inv_freq = 1 / 7.0 ** torch.arange(0, 1, 4 / 32)
    hidden_states = torch.randn(1, grid[0] * grid[1], 64)
    with torch.no_grad():
        expected = teacher_logits(teacher, hidden_states, grid)
        copied = student_logits(veca_from_teacher(teacher, num_cores=8), hidden_states, grid)
        zeroed = student_logits(veca_from_teacher(teacher, num_cores=8, rope_zero_fraction=0.125), hidden_states, grid)
        monkeypatch.setattr(vit_teacher, "rope_permutation", torch.arange)
        unpermuted = student_logits(veca_from_teacher(teacher, num_cores=8), hidden_states, grid)
    scale = expected.abs().mean()
    torch.testing.assert_close(copied, expected, rtol=1e-5, atol=1e-5 * scale)  # sums of 32 float32 products
    assert (unpermuted - expected).abs().mean() / scale > 0.3 and (zeroed - expected).abs().max() / scale > 0.01


def test_dinov2_patch_embeddings_with_positions_are_the_teachers(teacher):
    """The copy's embedding output (patch tokens plus its position table) is DINOv2's embedding output for the patch
    tokens, at the teacher's own 4 x 4 grid and at resized ones (square and not, up and down); the copy without a
    table is not (the test can fail). DINOv3 has no absolute positions, and the copy none."""
    if not hasattr(teacher.embeddings, "position_embeddings"):
        assert veca_from_teacher(teacher, num_cores=8).embeddings.position_embeddings is None
        return
    student = veca_from_teacher(teacher, num_cores=8).eval()
    without = veca_from_teacher(teacher, num_cores=8, position_embedding_grid=None).eval()
    for size in ((32, 32), (48, 48), (24, 40), (16, 16)):
        pixel_values = torch.randn(2, 3, *size)
        num_patches = size[0] * size[1] // 64
        with torch.no_grad():
            expected = teacher.embeddings(pixel_values)[:, -num_patches:]
            mine = student(pixel_values, output_hidden_states=True).hidden_states[0][:, 8:]
            theirs_without = without(pixel_values, output_hidden_states=True).hidden_states[0][:, 8:]
        torch.testing.assert_close(mine, expected, atol=0, rtol=0, msg=f"{size}")
        assert (theirs_without - expected).abs().max() > 0.1


def test_positions_of_an_image_in_a_padded_batch_are_its_own(teacher):
    """In a batch padded at the bottom and right (the image processor's), each image's patch tokens get the positions
    of its own grid, as alone: to float32 rounding (the padded path resizes by matrix products)."""
    if not hasattr(teacher.embeddings, "position_embeddings"):
        pytest.skip("DINOv3 has no absolute positions")
    student = veca_from_teacher(teacher, num_cores=8).eval()
    small, large = torch.randn(1, 3, 24, 40), torch.randn(1, 3, 48, 48)
    batch = torch.cat([F.pad(small, (0, 8, 0, 24)), large])
    pixel_mask = torch.zeros(2, 48, 48, dtype=torch.long)
    pixel_mask[0, :24, :40], pixel_mask[1] = 1, 1
    with torch.no_grad():
        padded = student(batch, pixel_mask=pixel_mask, output_hidden_states=True).hidden_states[0][:, 8:]
        alone = student(small, output_hidden_states=True).hidden_states[0][:, 8:]
        large_alone = student(large, output_hidden_states=True).hidden_states[0][:, 8:]
    torch.testing.assert_close(padded[0].unflatten(0, (6, 6))[:3, :5].flatten(0, 1), alone[0])
    torch.testing.assert_close(padded[1], large_alone[0])


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
    assert "copied from the teacher: embeddings.patch_embeddings.projection.weight" in printed
    assert "new: embeddings.core_bank.cores" in printed
    assert json.loads((tmp_path / "run.json").read_text())["args"]["init_from_teacher"] is True
    with open(tmp_path / "final" / "config.json") as f:
        assert json.load(f)["init_from_teacher"]["copied"][0] == "embeddings.patch_embeddings.projection.weight"


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
    from training.checkpointing import check_new_or_resumed_run

    now = vars(distill_veca.parse_args(["--teacher", "t", "--data", "d", "--output-dir", str(tmp_path),
                                        "--max-steps", "9", "--resume"]))
    old = {name: value for name, value in now.items() if name != "init_from_teacher"}
    (tmp_path / "run.json").write_text(json.dumps({"script": "training.distill_veca", "args": {**old, "resume": False},
                                                   "num_processes": 1}))
    check_new_or_resumed_run(str(tmp_path), {"script": "training.distill_veca", "args": now, "num_processes": 1})
    with pytest.raises(ValueError, match="--init-from-teacher was False"):
        check_new_or_resumed_run(str(tmp_path), {"script": "training.distill_veca", "args": {**now, "init_from_teacher": True},
                                         "num_processes": 1})
