"""One training step of ours against the authors' pretraining step, on their fixtures.

    python -m benchmarks.recipe_parity veca tests/fixtures/parity/training/veca/tiny_a [DIR ...]
    python -m benchmarks.recipe_parity lookwhere tests/fixtures/parity/training/lookwhere/case_a [DIR ...]

Each DIR holds what the authors' code computed for two steps of a tiny random model (the README beside the fixtures):
its checkpoint before step 1 in their released layout, two batches with teacher targets, the budget of each step, and
the loss, outputs, gradients and weights after each step. Here the checkpoint is converted with our converter and
each step runs the training script's loss and the optimiser, schedule and numerics that the method's recipe sets.

VECA (`veca-pretrain`, the authors' PyTorch step): train mode with the coordinate augmentation off (as in the
fixture). NorMuon orthogonalises in bfloat16, where any other kernel lands elsewhere: as the fixture README says, our
orthogonalisation input is checked against theirs and their output is replayed.

LookWhere (`lookwhere-dinov2`, the authors' JAX step): the recipe's student numerics (LayerNorm epsilon, tanh GELU,
antialiased resizes) and k rule (at most M patches), AdamW on kernels only. The expected gradients and weights, in the
authors' flax names, are brought to our names through the released layout (the case's name_map.json) and our
converter; key biases, whose true gradient is 0, are left out as the README says. Our teacher code is also run on the
case's stand-in teacher (teacher.safetensors) and must reproduce the targets the step was fed.

Prints the max abs difference of each quantity against its tolerance, the worst last; exit 1 when any is above its
tolerance.
"""

import argparse
import json
import re
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import Dinov2WithRegistersConfig, Dinov2WithRegistersModel

from corevision_hf.cli import HelpFormatter
from corevision_hf import LookWhereModel, VecaModel
from corevision_hf.convert import lookwhere as lookwhere_convert
from corevision_hf.convert.veca import RENAMES, convert_reference_state_dict, load_reference_checkpoint
from training.arguments import parse_config_overrides
from training.distill_lookwhere import patches_kept
from training.losses import lookwhere_loss, veca_loss
from training.optim import build_optimizer
from training.recipes import load_recipe
from training.schedule import warmup_cosine
from training.teacher import teacher_targets_and_map

# The fixture README's float32 tolerances (its measured floors are 2 to 10 times below them).
LOSS_ATOL, OUTPUT_ATOL, GRADIENT_RTOL_OF_MAX = 1e-6, 1e-5, 2e-5
WEIGHT_ATOL, WEIGHT_RTOL = 5e-7, 2e-7
ORTHO_RTOL, ORTHO_RTOL_OF_MAX, ORTHO_MIN_EQUAL = 2**-7, 2e-5, 0.995
# Without the orthogonalisation replay (README): a NorMuon matrix's change by its Frobenius norm; step-2 loss and
# outputs then move by up to ~2e-5 and ~1e-3, and step-2 weights are not compared element-wise.
STEP_NORM_RTOL, UNREPLAYED_STEP2_LOSS_ATOL, UNREPLAYED_STEP2_OUTPUT_ATOL = 0.025, 2e-5, 1e-3
_INVERSE_RENAMES = [(re.compile(re.escape(ours).replace(r"\{l\}", r"(\d+)")), ref) for ref, ours in RENAMES]


def reference_names(tensors: dict[str, torch.Tensor], chunk: int) -> dict[str, torch.Tensor]:
    """Our parameter names -> the authors' (the converter's mapping backwards): the bank in chunks of `chunk`, the
    coordinate heads' alphas as one `pos_alpha`, q / k / v apart."""
    out, alphas = {}, {}
    for name, value in tensors.items():
        if name == "embeddings.core_bank.cores":
            out.update({f"query_token_chunks.{i}": c for i, c in enumerate(value.split(chunk, dim=1))})
        elif name == "embeddings.core_bank.coordinates":
            out.update({f"qcoord_chunks.{i}": c[None] for i, c in enumerate(value.split(chunk))})
        elif match := re.fullmatch(r"encoder\.coordinate_heads\.(\d+)\.alpha", name):
            alphas[int(match.group(1))] = value
        else:
            for pattern, reference in _INVERSE_RENAMES:
                if match := pattern.match(name):
                    prefix = reference.replace("{l}", match.group(1)) if match.groups() else reference
                    out[prefix + name[match.end():]] = value
                    break
            else:
                raise KeyError(f"no reference name for {name}")
    if alphas:
        out["pos_alpha"] = torch.cat([alphas[i] for i in sorted(alphas)])
    return out


class Report:
    """The worst difference of each quantity, as a fraction of its tolerance."""

    def __init__(self):
        self.rows = []  # (quantity, value, value / tolerance at the worst element, what the value is)

    def add(self, quantity: str, ours: torch.Tensor, reference: torch.Tensor, atol: float, rtol: float = 0.0,
            ignore: torch.Tensor | None = None) -> None:
        if ours.shape != reference.shape:  # e.g. another number of patches kept
            self.add_value(f"{quantity} (shape {tuple(ours.shape)}, theirs {tuple(reference.shape)})", float("inf"),
                           float("inf"), "max abs diff")
            return
        difference = (ours.double() - reference.double()).abs()
        tolerance = atol + rtol * reference.double().abs()
        if ignore is not None:
            difference, tolerance = difference[~ignore], tolerance[~ignore]
        ratio = (difference / tolerance).max().item() if difference.numel() else 0.0
        self.add_value(quantity, difference.max().item() if difference.numel() else 0.0, ratio, "max abs diff")

    def add_value(self, quantity: str, value: float, ratio: float, what: str) -> None:
        """A row computed by the caller: `value` (`what` it is) and its ratio to the tolerance."""
        self.rows.append((quantity, value, ratio, what))

    def print(self) -> bool:
        """Prints one line per quantity kind (the worst over its tensors), the worst of all last; True when all pass."""
        kinds = {}
        for row in self.rows:
            kind = row[0].split(" ", 1)[0]
            if kind not in kinds or row[2] > kinds[kind][2]:
                kinds[kind] = row
        for quantity, difference, ratio, what in kinds.values():
            print(f"{quantity:60s} {what} {difference:.2e}  ({ratio:.2f} of its tolerance)")
        quantity, difference, ratio, _ = max(self.rows, key=lambda row: row[2])
        verdict = "within" if ratio <= 1 else "ABOVE"
        print(f"worst of all: {quantity}: {difference:.2e}, {ratio:.2f} of its tolerance ({verdict} tolerance)")
        return ratio <= 1


def replay(expected: dict, step: int, report: Report, chunk_names: dict[str, str]):
    """An `orthogonalize` that checks our bfloat16 input against the authors' (one bf16 rounding step, and at least
    99.5% of the elements equal) and returns their output."""

    def orthogonalize(updates: torch.Tensor, names: list[str]) -> torch.Tensor:
        outputs = []
        for update, name in zip(updates, names):
            reference = chunk_names[name]
            expected_in = expected[f"normuon/step{step}/ortho_in/{reference}"]
            scale = ORTHO_RTOL_OF_MAX * expected_in.float().abs().max().item()
            report.add(f"orthogonalisation-input step {step} {reference}", update.float(), expected_in.float(),
                       scale, ORTHO_RTOL)
            equal = (update == expected_in).float().mean().item()
            report.add_value(f"orthogonalisation-input-equal step {step} {reference} ({equal:.2%} equal)",
                             1 - equal, (1 - equal) / (1 - ORTHO_MIN_EQUAL), "share unequal")
            outputs.append(expected[f"normuon/step{step}/ortho_out/{reference}"])
        return torch.stack(outputs)

    return orthogonalize


def block_names(optimizer) -> dict[str, str]:
    """Our NorMuon matrix names (`encoder.layers.0.attention.q_proj.weight`) -> the authors'."""
    return {name: next(iter(reference_names({name: torch.zeros(1, 1)}, 1)))
            for group in optimizer.param_groups if group["algorithm"] == "normuon" for name in group["names"]}


def veca_fixture_model(folder: Path) -> tuple:
    """(the authors' state dict, their config, our VecaModel from it in training mode) of the fixture in `folder`."""
    state_dict, reference_config = load_reference_checkpoint(str(folder / "reference_checkpoint.pt"))
    config, weights = convert_reference_state_dict(state_dict, reference_config=reference_config)
    config.pos_embed_shift = config.pos_embed_rescale = None  # the fixture switched the coordinate augmentation off
    model = VecaModel(config)
    model.load_state_dict(weights)
    model.train()
    return state_dict, reference_config, model


def zero_gradient_masks(case: dict, state_dict: dict) -> dict[str, torch.Tensor]:
    """{authors' name: mask} of the elements whose true gradient is 0 (the case's `zero_true_gradient_elements`)."""
    ignored = {}  # elements whose true gradient is 0 and computed one rounding noise: no output depends on them
    for name, indices in case["zero_true_gradient_elements"]["flat_indices"].items():
        shape = state_dict[name].shape
        mask = torch.zeros(shape.numel(), dtype=torch.bool).index_fill_(0, torch.tensor(indices), True)
        ignored[name] = mask.view(shape)
    return ignored


def check_first_gradients(model, step: dict, expected: dict, chunk: int, report: Report, replay_gradients: bool,
                          reference_config) -> None:
    """Step 1's gradients against the authors' (exactly zero beyond the budget); with `replay_gradients`, theirs
    copied into the model's."""
    grads = reference_names({n: p.grad for n, p in model.named_parameters()}, chunk)
    for name, grad in grads.items():
        if name in step["params_without_grad"]:  # beyond the budget: no gradient there, exactly zero here
            report.add(f"gradient-unused step 1 {name}", grad, torch.zeros_like(grad), 1e-30)
        else:
            reference = expected[f"grad/{name}"]
            report.add(f"gradient step 1 {name}", grad, reference,
                       GRADIENT_RTOL_OF_MAX * reference.abs().max().item())
    if replay_gradients:
        theirs = {name: expected.get(f"grad/{name}", torch.zeros_like(grad)) for name, grad in grads.items()}
        _, theirs = convert_reference_state_dict(theirs, reference_config=reference_config)
        for name, param in model.named_parameters():
            param.grad.copy_(theirs[name])


def check_case(folder: Path, replay_gradients: bool = True, replay_orthogonalization: bool = True) -> Report:
    """Runs the two steps of the fixture in `folder`; returns the differences. Replays (each checked first): the
    step-1 gradients, whose float32 rounding AdamW's first step g / (|g| + eps) magnifies where |g| is tiny, and the
    bfloat16 orthogonalisation. Without the latter, NorMuon matrices are compared by the Frobenius norm of their
    change over the two steps (the fixture README's looser check, 2.5%)."""
    case = json.loads((folder / "case.json").read_text())
    inputs, expected = load_file(folder / "inputs.safetensors"), load_file(folder / "expected.safetensors")
    state_dict, reference_config, model = veca_fixture_model(folder)
    recipe = load_recipe("veca-pretrain")
    optimizer = build_optimizer(model, recipe["optimizer"], recipe["lr"], recipe["weight_decay"])
    chunk = case["model"]["nested_chunk_size"]
    ignored = zero_gradient_masks(case, state_dict)
    matrices = set(case["optimizer"]["normuon_names"])
    names = block_names(optimizer)
    report = Report()
    for step in case["steps"]:
        s, budget = step["step"], step["active_k"]
        for group in optimizer.param_groups:
            group["lr"] = step["lr"]["normuon" if group["algorithm"] == "normuon" else "adamw"]
        optimizer.zero_grad(set_to_none=True)
        output = model(inputs[f"step{s}/pixel_values"], num_cores=budget)
        patches = output.last_hidden_state[:, budget:]
        loss, terms = veca_loss(output.pooler_output, patches, inputs[f"step{s}/teacher_cls"],
                                inputs[f"step{s}/teacher_patches"], recipe["dense_weight"], recipe["mse_weight"])
        loss.backward()
        losses = {"total": loss, "cls": 1 - terms["cls_cosine"], "dense_cos": 1 - terms["patch_cosine"],
                  "dense_mse": terms["patch_mse"]}
        loose = s > 1 and not replay_orthogonalization
        loss_atol, output_atol = (UNREPLAYED_STEP2_LOSS_ATOL, UNREPLAYED_STEP2_OUTPUT_ATOL) if loose else (LOSS_ATOL,
                                                                                                        OUTPUT_ATOL)
        for term, value in losses.items():
            report.add(f"loss step {s} {term}", value.detach(), expected[f"loss/step{s}/{term}"], loss_atol)
        report.add(f"output step {s} cls", output.pooler_output.detach(), expected[f"out/step{s}/cls"], output_atol)
        report.add(f"output step {s} patches", patches.detach(), expected[f"out/step{s}/patches"], output_atol)
        if s == 1:
            check_first_gradients(model, step, expected, chunk, report, replay_gradients, reference_config)
        if replay_orthogonalization:
            optimizer.orthogonalize = replay(expected, s, report, names)
        optimizer.step()
        for name, value in reference_names(dict(model.named_parameters()), chunk).items():
            reference = expected[f"step{s}/{name}"]
            if loose or name in matrices and not replay_orthogonalization:
                if name in matrices and s == len(case["steps"]):
                    change, reference_change = (value.detach() - state_dict[name]).norm(), (reference - state_dict[name]).norm()
                    relative = abs(change / reference_change - 1).item()
                    report.add_value(f"step-norm-over-both-steps {name}", relative, relative / STEP_NORM_RTOL,
                                     "relative diff")
                continue
            report.add(f"weights-after-step-{s} {name}", value.detach(), reference, WEIGHT_ATOL, WEIGHT_RTOL,
                       ignored.get(name))
    return report


# ---------------------------------------------------------------- LookWhere: the authors' JAX step

# The fixture README's float32 tolerances (its measured floors are 3 to 20 times below them). The teacher's targets: ours
# are within 4.5e-6 of theirs, and 2.1e-5 on one ill-conditioned register token (case_a); LayerNorm epsilon 1e-6 moves
# the patch targets by 1.1e-4 and the registers by 1.8e-4, exact GELU every target by 2.7e-4 to 1e-3.
TEACHER_ATOL = 5e-5
LW_LOSS_ATOL, LW_MAP_ATOL, LW_OUTPUT_ATOL, LW_GRADIENT_RTOL_OF_MAX = 2e-6, 5e-6, 2e-5, 2e-5
LW_WEIGHT_ATOL, LW_WEIGHT_SHARE, LW_WEIGHT_ATOL_OF_LR = 2e-7, 0.995, 0.25
LR_RTOL = 1e-5  # the float32 learning rate the step read against ours (float64): 6.5e-7 apart in a warm-up

# How the authors' flax tensors become the released layout: the rules name_map.json states for each released name.
FLAX_TO_RELEASE = {
    "same": lambda t: t[0],
    "reshape (G,G,D)->(1,G*G,D)": lambda t: t[0].reshape(1, -1, t[0].shape[-1]),
    "permute (p,p,C,D)->(D,C,p,p)": lambda t: t[0].permute(3, 2, 0, 1),
    "rows [q; k; v], each kernel.reshape(D, D).T": lambda t: torch.cat([x.reshape(x.shape[0], -1).T for x in t]),
    "concat [q; k; v], each (H, hd) flattened": lambda t: torch.cat([x.flatten() for x in t]),
    "kernel (H, hd, D).reshape(D, D).T": lambda t: t[0].reshape(-1, t[0].shape[-1]).T,
    "transpose": lambda t: t[0].T,
}
RELEASE_PARTS = (("selector.backbone.", ("selector", "backbone")), ("selector.head.", ("selector", "head")),
                 ("extractor.", ("extractor",)))


def release_layout(tensors: dict[str, torch.Tensor], name_map: dict) -> dict:
    """Flax-named tensors (weights, gradients or masks of them) -> the released checkpoint layout
    {"selector": {"backbone", "head"}, "extractor"}, by the rules of the case's name_map.json."""
    checkpoint = {"selector": {"backbone": {}, "head": {}}, "extractor": {}}
    for name, entry in name_map["release_name"].items():
        if entry["rule"] not in FLAX_TO_RELEASE:
            raise ValueError(f"name_map.json: unknown rule {entry['rule']!r} for {name}")
        prefix, path = next((prefix, path) for prefix, path in RELEASE_PARTS if name.startswith(prefix))
        part = checkpoint
        for key in path:
            part = part[key]
        part[name[len(prefix):]] = FLAX_TO_RELEASE[entry["rule"]]([tensors[n] for n in entry["from"]]).contiguous()
    return checkpoint


def dinov2_from_flax(weights: dict[str, torch.Tensor], num_heads: int, layer_norm_eps: float, hidden_act: str):
    """The authors' flax ViT (`modeling.ViT`: no position for CLS and registers) as a transformers
    `Dinov2WithRegistersModel`, the kind of teacher training.teacher runs, with the given numerics."""
    patch, _, channels, dim = weights["embed/wte/kernel"].shape
    grid = weights["embed/wpe"].shape[0]
    depth = 1 + max(int(name.split("/")[0].removeprefix("layer_")) for name in weights if name.startswith("layer_"))
    config = Dinov2WithRegistersConfig(
        hidden_size=dim, num_hidden_layers=depth, num_attention_heads=num_heads,
        mlp_ratio=weights["layer_0/ff/w1/kernel"].shape[1] // dim, patch_size=patch, num_channels=channels,
        image_size=grid * patch, num_register_tokens=weights["reg_token"].shape[1], layer_norm_eps=layer_norm_eps,
        hidden_act=hidden_act,
    )
    state = {
        "embeddings.cls_token": weights["cls_token"],
        "embeddings.mask_token": torch.zeros(1, dim),
        "embeddings.register_tokens": weights["reg_token"],
        # transformers adds a CLS position; the authors' CLS has none
        "embeddings.position_embeddings": torch.cat([torch.zeros(1, 1, dim), weights["embed/wpe"].reshape(1, -1, dim)],
                                                    dim=1),
        "embeddings.patch_embeddings.projection.weight": weights["embed/wte/kernel"].permute(3, 2, 0, 1),
        "embeddings.patch_embeddings.projection.bias": weights["embed/wte/bias"],
        "layernorm.weight": weights["norm/scale"],
        "layernorm.bias": weights["norm/bias"],
    }
    for i in range(depth):
        ours, theirs = f"encoder.layer.{i}.", f"layer_{i}/"
        for part in "qkv":
            kernel = weights[f"{theirs}attn/w{part}/kernel"]
            state[f"{ours}attention.{part}_proj.weight"] = kernel.reshape(dim, -1).T
            state[f"{ours}attention.{part}_proj.bias"] = weights[f"{theirs}attn/w{part}/bias"].flatten()
        state[f"{ours}attention.o_proj.weight"] = weights[f"{theirs}attn/wo/kernel"].reshape(-1, dim).T
        state[f"{ours}attention.o_proj.bias"] = weights[f"{theirs}attn/wo/bias"]
        for j in "12":
            state[f"{ours}norm{j}.weight"] = weights[f"{theirs}norm{j}/scale"]
            state[f"{ours}norm{j}.bias"] = weights[f"{theirs}norm{j}/bias"]
            state[f"{ours}layer_scale{j}.lambda1"] = weights[f"{theirs}scale{j}"]
            state[f"{ours}mlp.fc{j}.weight"] = weights[f"{theirs}ff/w{j}/kernel"].T
            state[f"{ours}mlp.fc{j}.bias"] = weights[f"{theirs}ff/w{j}/bias"]
    model = Dinov2WithRegistersModel(config)
    model.load_state_dict({name: value.contiguous() for name, value in state.items()})
    return model.eval().requires_grad_(False)


def check_teacher(folder: Path, case: dict, inputs: dict, report: Report, map_queries: str) -> None:
    """Our teacher code (training.teacher) on the case's stand-in teacher reproduces the targets each step was fed."""
    model = case["model"]
    teacher = dinov2_from_flax(load_file(folder / "teacher.safetensors"), model["heads"], model["layer_norm_eps"],
                               "gelu_pytorch_tanh")
    registers = slice(1, 1 + model["num_registers"])
    for step in case["steps"]:
        s, pixel_values = step["step"], inputs[f"step{step['step']}/pixel_values"]
        cls, patches, attention_map = teacher_targets_and_map(teacher, pixel_values, tuple(model["grid"]), map_queries)
        with torch.no_grad():
            register_tokens = teacher(pixel_values).last_hidden_state[:, registers]
        for name, ours in (("cls", cls), ("registers", register_tokens), ("patches", patches), ("map", attention_map)):
            report.add(f"teacher-target step {s} {name}", ours, inputs[f"step{s}/teacher_{name}"], TEACHER_ATOL)


def lookwhere_fixture_model(folder: Path, heads: int, recipe: dict) -> tuple:
    """(config, weights, our LookWhereModel in training mode): the fixture's checkpoint with the recipe's numerics."""
    checkpoint = lookwhere_convert.load_lookwhere_checkpoint(str(folder / "reference_checkpoint.pt"))
    config, weights = lookwhere_convert.convert_reference_state_dict(checkpoint, heads)
    for name, value in parse_config_overrides(recipe["config_overrides"]).items():  # the recipe's student numerics
        setattr(config, name, value)
    model = LookWhereModel(config)
    model.load_state_dict(weights)
    model.train()
    return config, weights, model


def check_lookwhere_outputs(output, expected: dict, s: int, registers: slice, report: Report) -> None:
    """Step `s`'s selector map, selected patches, CLS, registers and dense patches against the authors'."""
    report.add(f"selector-map step {s}", output.selector_map.detach(), expected[f"out/step{s}/selector_map"],
               LW_MAP_ATOL)
    report.add(f"selected-patches step {s}", output.selected_indices, expected[f"out/step{s}/selected_indices"],
               0.5)  # any other patch is a whole index away
    for name, value in (("cls", output.pooler_output), ("registers", output.last_hidden_state[:, registers]),
                        ("dense_patches", output.patch_tokens)):
        report.add(f"output step {s} {name}", value.detach(), expected[f"out/step{s}/{name}"], LW_OUTPUT_ATOL)


def check_lookwhere_weights(model, reference_weights: dict, ignored: dict, s: int, every_element: float,
                            report: Report) -> None:
    """The weights after step `s` against the authors': every element within `every_element`, and the share within
    LW_WEIGHT_ATOL at least LW_WEIGHT_SHARE (the `ignored` elements aside)."""
    for name, param in model.named_parameters():
        value, reference, keep = param.detach(), reference_weights[name], ~ignored[name]
        report.add(f"weights-after-step-{s} {name}", value, reference, every_element, ignore=ignored[name])
        close = ((value - reference).abs() <= LW_WEIGHT_ATOL)[keep].float().mean().item()
        report.add_value(f"weights-within-2e-7-after-step-{s} {name}", 1 - close,
                         (1 - close) / (1 - LW_WEIGHT_SHARE), "share beyond")


def check_lookwhere_case(folder: Path, recipe: dict | None = None) -> Report:
    """Runs the two steps of the LookWhere fixture in `folder` with `recipe` (default: `lookwhere-dinov2`); returns
    the differences."""

    case = json.loads((folder / "case.json").read_text())
    name_map = json.loads((folder / "name_map.json").read_text())
    inputs, expected = load_file(folder / "inputs.safetensors"), load_file(folder / "expected.safetensors")
    heads = case["model"]["heads"]

    def ours(flax_tensors: dict) -> dict:  # the authors' flax names -> ours, through the released layout
        return lookwhere_convert.convert_reference_state_dict(release_layout(flax_tensors, name_map), heads)[1]

    recipe = recipe or load_recipe("lookwhere-dinov2")
    config, weights, model = lookwhere_fixture_model(folder, heads, recipe)
    report = Report()
    before = load_file(folder / "weights_before.safetensors")
    for name, value in ours(before).items():  # our reading of the flax names, checked on the weights themselves
        report.add(f"flax-names-read {name}", value, weights[name], 1e-30)
    key_biases = set(case["zero_true_gradient_elements"]["names"])
    ignored = ours({name: torch.full(value.shape, name in key_biases) for name, value in before.items()})
    check_teacher(folder, case, inputs, report, recipe["map_queries"])

    optimizer = build_optimizer(model, recipe["optimizer"], recipe["lr"], recipe["weight_decay"])
    registers, floor = slice(1, 1 + config.num_register_tokens), 0.0
    for step in case["steps"]:
        s = step["step"]
        lr = recipe["lr"] * warmup_cosine(step["schedule_index"], recipe["warmup_steps"], recipe["max_steps"],
                                          recipe["min_lr"] / recipe["lr"], recipe["warmup_start_lr"] / recipe["lr"])
        report.add(f"learning-rate step {s}", torch.tensor(lr), torch.tensor(step["lr"]), 0.0, LR_RTOL)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        k = patches_kept(step["k_drawn"], case["selection"]["slots"])
        output = model(inputs[f"step{s}/pixel_values"], k=k)
        teacher = {name: inputs[f"step{s}/teacher_{name}"] for name in ("cls", "registers", "patches", "map")}
        loss, terms = lookwhere_loss(output.pooler_output, output.patch_tokens, output.selector_map, teacher["cls"],
                                     teacher["patches"], teacher["map"], map_weight=recipe["map_weight"])
        loss.backward()
        losses = {"total": loss, "cls": terms["cls_mse"], "patch": terms["patch_mse"], "map": terms["map_kl"]}
        if config.num_register_tokens:  # their weight 0; without registers a mean of nothing (NaN on both sides)
            losses["reg"] = F.mse_loss(output.last_hidden_state[:, registers], teacher["registers"])
        for term, value in losses.items():
            report.add(f"loss step {s} {term}", value.detach(), expected[f"loss/step{s}/{term}"], LW_LOSS_ATOL)
        check_lookwhere_outputs(output, expected, s, registers, report)
        reference_grads = ours({name[len(f"grad/step{s}/"):]: value for name, value in expected.items()
                                if name.startswith(f"grad/step{s}/")})
        for name, param in model.named_parameters():
            reference = reference_grads[name]
            report.add(f"gradient step {s} {name}", param.grad, reference,
                       LW_GRADIENT_RTOL_OF_MAX * reference.abs().max().item(), ignore=ignored[name])
        optimizer.step()
        # Every element within lr / 4, or twice what the authors' own two compilations of a step so far differ by (an
        # element whose gradient is ~1e-9 by accident moves by a share of lr that follows rounding, and stays moved).
        floor = max(floor, step.get("max_abs_diff_training_step_vs_grads_then_optax", {}).get("all_other", 0.0))
        every_element = max(LW_WEIGHT_ATOL_OF_LR * lr, 2 * floor)
        reference_weights = ours({name[len(f"step{s}/"):]: value for name, value in expected.items()
                                  if name.startswith(f"step{s}/")})
        check_lookwhere_weights(model, reference_weights, ignored, s, every_element, report)
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("method", choices=["veca", "lookwhere"], help="the recipe family the fixtures were made with")
    parser.add_argument("folders", nargs="+", type=Path, help="fixture folders (case.json, *.safetensors, *.pt)")
    parser.add_argument("--no-gradient-replay", action="store_true",
                        help="VECA: step 1 with our own gradients (AdamW's first step magnifies their rounding)")
    parser.add_argument("--no-orthogonalization-replay", action="store_true",
                        help="VECA: our own bfloat16 orthogonalisation; NorMuon matrices compared by the norm of their "
                             "change")
    args = parser.parse_args(argv)
    for folder in args.folders:
        if not (folder / "case.json").is_file():
            parser.error(f"{folder} is no fixture folder (it holds no case.json): give folders such as "
                         f"tests/fixtures/parity/training/{args.method}/...")
    torch.manual_seed(0)
    passed = True
    for folder in args.folders:
        print(f"# {folder}")
        if args.method == "lookwhere":
            report = check_lookwhere_case(folder)
        else:
            report = check_case(folder, not args.no_gradient_replay, not args.no_orthogonalization_replay)
        passed &= report.print()
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
