"""FSDP2 on CPU processes (gloo): each student sharded (every layer, then the root, as training/configs/fsdp.yaml asks
accelerate to wrap it) gives the loss and gradients of one process on the whole batch, its optimiser step the same
weights, and a sharded checkpoint (torch.distributed.checkpoint) saved and loaded into a fresh sharded model gives
them back; the full state dict gathered for the export equals the one-process weights.

    torchrun --nproc_per_node 2 -m tests.fsdp_check OUT_DIR   # from the root: one line per check, exit 1 on a failure

accelerate itself does not run FSDP on CPUs (training.loop refuses such a launch), so this drives torch's FSDP2 and
distributed checkpointing directly, with the training scripts' losses and optimiser.
"""

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard

from corevision_hf import LookWhereModel, VecaModel
from tests.conftest import tiny_lookwhere_config, tiny_veca_config
from training.losses import lookwhere_loss, veca_loss
from training.optim import build_optimizer

TOLERANCE = 1e-5
# AdamW's first step is lr * g / (|g| + eps): where |g| is within rounding of 0 (below TINY_GRADIENT, next to gradients
# of order 1e-2), the step follows the rounding of g and may take any value up to lr, so those elements are compared
# by their gradient alone (above). A tenth of a step (lr 1e-3) still catches a step on the wrong shard, a missed or
# doubled update, everywhere else.
STEP_TOLERANCE, TINY_GRADIENT = 1e-4, 1e-6


def build(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = VecaModel(tiny_veca_config()) if name == "veca" else LookWhereModel(tiny_lookwhere_config())
    return model.train()


def loss_of(name: str, model, pixel_values: torch.Tensor, targets: dict) -> torch.Tensor:
    if name == "veca":
        output = model(pixel_values, num_cores=4)
        return veca_loss(output.pooler_output, output.last_hidden_state[:, 4:], targets["cls"], targets["patches"])[0]
    output = model(pixel_values, k=12)
    return lookwhere_loss(output.pooler_output, output.last_hidden_state[:, 5:], output.selector_map, targets["cls"],
                          targets["patches"], targets["map"])[0]


def shard(model) -> None:
    for layer in [m for m in model.modules() if type(m).__name__ in model._no_split_modules]:
        fully_shard(layer)
    fully_shard(model)


def full(tensor):
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def check(name: str, rank: int, world: int, folder: Path) -> list[str]:
    torch.manual_seed(1)
    pixel_values = torch.randn(4, 3, 32, 32)
    width = 64 if name == "veca" else 32
    patches = 16 if name == "veca" else 64
    targets = {"cls": torch.randn(4, width), "patches": torch.randn(4, patches, width), "map": torch.randn(4, patches)}
    # one process, the whole batch (mean over the batch: each half weighs 1/2)
    reference = build(name)
    loss = loss_of(name, reference, pixel_values, targets)
    loss.backward()
    reference_grads = {n: p.grad.clone() for n, p in reference.named_parameters() if p.grad is not None}
    optimizer = build_optimizer(reference, "adamw", 1e-3, 0.05)
    optimizer.step()
    reference_weights = {n: p.detach().clone() for n, p in reference.named_parameters()}
    # sharded: this process's half of the batch; FSDP2 averages the gradients over the processes
    model = build(name)
    shard(model)
    half = slice(rank * 4 // world, (rank + 1) * 4 // world)
    local = loss_of(name, model, pixel_values[half], {k: v[half] for k, v in targets.items()})
    local.backward()
    losses = [torch.zeros(()) for _ in range(world)]
    dist.all_gather(losses, local.detach())
    failures = []
    if abs(torch.stack(losses).mean() - loss).item() > TOLERANCE:
        failures.append(f"loss {torch.stack(losses).mean().item()} vs {loss.item()}")
    for parameter_name, parameter in model.named_parameters():
        if parameter.grad is None:
            continue
        difference = (full(parameter.grad) - reference_grads[parameter_name]).abs().max().item()
        if difference > TOLERANCE:
            failures.append(f"gradient {parameter_name}: {difference:.1e}")
    sharded_optimizer = build_optimizer(model, "adamw", 1e-3, 0.05)
    sharded_optimizer.step()
    stepped = {parameter_name: full(parameter.detach()) for parameter_name, parameter in model.named_parameters()}
    for parameter_name, value in stepped.items():
        settled = reference_grads[parameter_name].abs() >= TINY_GRADIENT
        difference = ((value - reference_weights[parameter_name]).abs() * settled).max().item()
        if difference > STEP_TOLERANCE:
            failures.append(f"weights after a step {parameter_name}: {difference:.1e}")
    # a sharded checkpoint, saved and loaded into a fresh sharded model; then the export's full state dict
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(folder / name))
    fresh = build(name)
    shard(fresh)
    state = {"model": fresh.state_dict()}
    dcp.load(state, checkpoint_id=str(folder / name))
    fresh.load_state_dict(state["model"])
    exported = get_model_state_dict(fresh, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        for parameter_name, value in exported.items():
            if parameter_name in stepped:
                difference = (value - stepped[parameter_name]).abs().max().item()
                if difference > 0:  # exactly the sharded model's weights, gathered
                    failures.append(f"exported after the checkpoint {parameter_name}: {difference:.1e}")
    return failures


def main() -> int:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    folder = Path(sys.argv[1])
    failed = False
    for name in ("veca", "lookwhere"):
        failures = check(name, rank, world, folder)
        failed |= bool(failures)
        print(f"rank {rank} {name}: " + ("same loss, gradients, step and checkpoint" if not failures else
                                           "; ".join(failures[:5])), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
