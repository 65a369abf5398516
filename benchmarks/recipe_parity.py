"""One training step of ours against the VECA authors' pretraining step, on their fixtures.

    python -m benchmarks.recipe_parity veca tests/fixtures/parity/training/veca/tiny_a [DIR ...]

Each DIR holds what the authors' code computed for two steps of a tiny VECA (tests/fixtures/parity/training/README.md):
its checkpoint before step 1, two batches with teacher targets, the core budget of each step, and the loss, outputs,
gradients and weights after each step. Here the checkpoint is converted with our converter, and each step runs the
training script's loss and the optimiser that the `veca-pretrain` recipe builds, at the fixture's learning rates, in
train mode with the coordinate augmentation off (as in the fixture). NorMuon orthogonalises in bfloat16, where any other
kernel lands elsewhere: as the fixture README says, our orthogonalisation input is checked against theirs and their
output is replayed. Prints the max abs difference of each quantity against its tolerance, the worst last; exit 1 when
any is above its tolerance.
"""

import argparse
import json
import re
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from corevision_hf.cli import HelpFormatter
from corevision_hf import VecaModel
from corevision_hf.convert.veca import RENAMES, convert_reference_state_dict, load_reference_checkpoint
from training.losses import veca_loss
from training.optim import build_optimizer
from training.recipes import load_recipe

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
        if name == "core_bank.cores":
            out.update({f"query_token_chunks.{i}": c for i, c in enumerate(value.split(chunk, dim=1))})
        elif name == "core_bank.coordinates":
            out.update({f"qcoord_chunks.{i}": c[None] for i, c in enumerate(value.split(chunk))})
        elif match := re.fullmatch(r"coordinate_heads\.(\d+)\.alpha", name):
            alphas[int(match.group(1))] = value
        elif match := re.fullmatch(r"layers\.(\d+)\.attention\.qkv\.(weight|bias)", name):
            for part, block in zip("qkv", value.chunk(3)):
                out[f"blocks.{match.group(1)}.attn.{part}_proj.{match.group(2)}"] = block
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
        self.rows = []  # (quantity, max abs difference, worst difference / tolerance)

    def add(self, quantity: str, ours: torch.Tensor, reference: torch.Tensor, atol: float, rtol: float = 0.0,
            ignore: torch.Tensor | None = None) -> None:
        difference = (ours.double() - reference.double()).abs()
        tolerance = atol + rtol * reference.double().abs()
        if ignore is not None:
            difference, tolerance = difference[~ignore], tolerance[~ignore]
        ratio = (difference / tolerance).max().item() if difference.numel() else 0.0
        self.rows.append((quantity, difference.max().item() if difference.numel() else 0.0, ratio))

    def print(self) -> bool:
        """Prints one line per quantity kind (the worst over its tensors), the worst of all last; True when all pass."""
        kinds = {}
        for quantity, difference, ratio in self.rows:
            kind = quantity.split(" ", 1)[0]
            if kind not in kinds or ratio > kinds[kind][2]:
                kinds[kind] = (quantity, difference, ratio)
        for quantity, difference, ratio in kinds.values():
            print(f"{quantity:60s} max abs diff {difference:.2e}  ({ratio:.2f} of its tolerance)")
        quantity, difference, ratio = max(self.rows, key=lambda row: row[2])
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
            report.rows.append((f"orthogonalisation-input-equal step {step} {reference} ({equal:.2%} equal)",
                                1 - equal, (1 - equal) / (1 - ORTHO_MIN_EQUAL)))
            outputs.append(expected[f"normuon/step{step}/ortho_out/{reference}"])
        return torch.stack(outputs)

    return orthogonalize


def block_names(optimizer) -> dict[str, str]:
    """Our NorMuon block names (`layers.0.attention.qkv.weight[1]`, `layers.0.mlp.fc1.weight`) -> the authors'."""
    names = {}
    for group in optimizer.param_groups:
        for name in group["names"] if group["algorithm"] == "normuon" else []:
            if group["split_sizes"]:
                layer = name.split(".")[1]
                names.update({f"{name}[{i}]": f"blocks.{layer}.attn.{part}_proj.weight" for i, part in enumerate("qkv")})
            else:
                names[name] = next(iter(reference_names({name: torch.zeros(1, 1)}, 1)))
    return names


def check_case(folder: Path, replay_gradients: bool = True, replay_orthogonalization: bool = True) -> Report:
    """Runs the two steps of the fixture in `folder`; returns the differences. Replays (each checked first): the
    step-1 gradients, whose float32 rounding AdamW's first step g / (|g| + eps) magnifies where |g| is tiny, and the
    bfloat16 orthogonalisation. Without the latter, NorMuon matrices are compared by the Frobenius norm of their
    change over the two steps (the fixture README's looser check, 2.5%)."""
    case = json.loads((folder / "case.json").read_text())
    inputs, expected = load_file(folder / "inputs.safetensors"), load_file(folder / "expected.safetensors")
    state_dict, reference_config = load_reference_checkpoint(str(folder / "reference_checkpoint.pt"))
    config, weights = convert_reference_state_dict(state_dict, reference_config=reference_config)
    config.pos_embed_shift = config.pos_embed_rescale = None  # the fixture switched the coordinate augmentation off
    model = VecaModel(config)
    model.load_state_dict(weights)
    model.train()
    recipe = load_recipe("veca-pretrain")
    optimizer = build_optimizer(model, recipe["optimizer"], recipe["lr"], recipe["weight_decay"])
    chunk = case["model"]["nested_chunk_size"]
    ignored = {}  # elements whose true gradient is 0 and computed one rounding noise: no output depends on them
    for name, indices in case["zero_true_gradient_elements"]["flat_indices"].items():
        shape = state_dict[name].shape
        ignored[name] = torch.zeros(shape.numel(), dtype=torch.bool).index_fill_(0, torch.tensor(indices), True).view(shape)
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
        if replay_orthogonalization:
            optimizer.orthogonalize = replay(expected, s, report, names)
        optimizer.step()
        for name, value in reference_names(dict(model.named_parameters()), chunk).items():
            reference = expected[f"step{s}/{name}"]
            if loose or name in matrices and not replay_orthogonalization:
                if name in matrices and s == len(case["steps"]):
                    change, reference_change = (value.detach() - state_dict[name]).norm(), (reference - state_dict[name]).norm()
                    relative = abs(change / reference_change - 1).item()
                    report.rows.append((f"step-norm-over-both-steps {name}", relative, relative / STEP_NORM_RTOL))
                continue
            report.add(f"weights-after-step-{s} {name}", value.detach(), reference, WEIGHT_ATOL, WEIGHT_RTOL,
                       ignored.get(name))
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("method", choices=["veca"], help="the recipe family the fixtures were made with")
    parser.add_argument("folders", nargs="+", type=Path, help="fixture folders (case.json, *.safetensors, *.pt)")
    parser.add_argument("--no-gradient-replay", action="store_true",
                        help="step 1 with our own gradients (AdamW's first step magnifies their rounding)")
    parser.add_argument("--no-orthogonalization-replay", action="store_true",
                        help="our own bfloat16 orthogonalisation; NorMuon matrices compared by the norm of their change")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    passed = True
    for folder in args.folders:
        print(f"# {folder}")
        report = check_case(folder, not args.no_gradient_replay, not args.no_orthogonalization_replay)
        passed &= report.print()
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
