"""Issue #67 item 4: stage 2 of the conversion with LoRA (PEFT) or every weight, chosen on validation.

Both arms start from the committed `make tasks-veca` run's end of stage 1 (its checkpoint after 300 steps, kept in
outputs/sparse_recognition_veca_scratch/VECA_from_teacher) and see the same 300 batches and core budgets
(training.conversion's batch order and nested-dropout draws, seed 0). "full" is that run's own stage 2 (its final
student, every weight at 2e-5); "lora" is LoRA rank 8 on q / k / v / o beside the bank and coordinate heads, at 1e-4
(LoRA's usual rate; not tuned here). Each is read the way the benchmark reads its lines: the linear probe on [pooled ;
mean patch token] fitted on the 320 training canvases that are not validation ones, scored on the 80 validation
canvases (the decay picked there too, so both arms are equally optimistic), at C = 8 and 64; plus the per-block table
and the final features' cosines on the first 16 validation canvases. No test canvas is read.

The rule, written before the run: LoRA becomes the benchmark's default only if its validation accuracy at C = 64 is
above full weights' by a paired 95% interval above 0; otherwise every weight stays the default.

    python -m experiments.veca_conversion.stage2_lora    # about 20 minutes on the 2-core CPU
"""

import argparse
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from benchmarks import sparse_recognition_veca as srv
from corevision_hf import VecaModel
from evaluation.canvases import task_splits
from evaluation.paired_stats import bootstrap_rows, interval
from evaluation.readers import probe
from evaluation.task_conversion import checkpoint_path, conversion_images, table_canvases
from evaluation.teachers import load_teacher_model
from training.checkpointing import write_json
from training.conversion import end_to_end, table_record, teacher_targets

OUT = Path(__file__).parent / "results" / "stage2_lora.json"
LORA_RANK, LORA_LR = 8, 1e-4


def validation_reads(args, model, split) -> dict:
    """Per C: the probe fitted on the split's first len - val canvases, its decay picked and its accuracy read on the
    last val (the validation canvases), with each canvas's correctness."""
    out = {}
    for c in (srv.LOW_CORES, srv.FULL_CORES):
        features = srv.veca_features(model, split, c, args.batch_size)
        read = probe(features, split.labels, features[-args.val:], args.val, args.probe_decays)
        correct = (read["predictions"] == split.labels[-args.val:]).float()
        out[c] = {"correct": correct, "weight_decay": read["weight_decay"]}
        print(f"  C = {c}: validation accuracy {float(correct.mean()):.3f}", flush=True)
    return out


def lora_arm(args, folder: Path, teacher, images) -> tuple:
    """Stage 2 with LoRA from the kept end of stage 1, on convert's batches: (the student, its losses, seconds)."""
    stage1 = VecaModel.from_pretrained(str(folder / "start")).float()
    stage1.load_state_dict(load_file(str(checkpoint_path(folder, args.stage1_steps))))
    count, size = len(images), args.convert_batch_size

    def batch(step: int) -> torch.Tensor:  # training.conversion.convert's order, so both arms see the same batches
        order = torch.randperm(count, generator=torch.Generator().manual_seed(args.seed + step // count))
        first = (step * size) % count
        return images[order[torch.arange(first, first + size) % count]]

    print(f"lora: stage 2 from the end of stage 1, rank {LORA_RANK}, lr {LORA_LR}, {args.stage2_steps[-1]} steps",
          flush=True)
    began = time.perf_counter()
    lora, losses = end_to_end(stage1, teacher, batch, args.stage2_steps[-1], LORA_LR, args.seed, LORA_RANK)
    return lora.eval(), losses, time.perf_counter() - began


def summary(args, folder: Path, source: str, lora_run: dict, record: dict) -> dict:
    """The JSON: both arms' per-block tables, cosines and validation reads with 95% intervals, LoRA minus every weight
    at each C (paired), and the choice by the rule."""
    rows = bootstrap_rows(args.val, args.bootstrap, args.seed)
    result = {"teacher": source, "from": f"{folder}: checkpoint_{args.stage1_steps} (the end of stage 1)",
              "stage2_steps": args.stage2_steps[-1], "full": {"lr": args.stage2_lr, "trainable": "every weight"},
              "lora": {"rank": LORA_RANK, "lr": LORA_LR, "trainable": "LoRA on q/k/v/o, the bank, coordinate heads",
                       **lora_run},
              "validation_canvases": args.val, "cores": [srv.LOW_CORES, srv.FULL_CORES], "arms": {}, "lora - full": {}}
    for name, arm in record.items():
        table = arm["table"]
        result["arms"][name] = {
            "transfer_error_mean": {k: sum(v) / len(v) for k, v in table["transfer_error"].items()},
            "transfer_error": table["transfer_error"], "final_cosines": table["final_cosines"],
            "validation": {str(c): {"accuracy": interval(read["correct"], rows), "weight_decay": read["weight_decay"],
                                    "correct": read["correct"].int().tolist()}
                           for c, read in arm["validation"].items()}}
    for c in (srv.LOW_CORES, srv.FULL_CORES):
        result["lora - full"][str(c)] = interval(
            record["lora"]["validation"][c]["correct"] - record["full"]["validation"][c]["correct"], rows)
    result["rule"] = ("LoRA becomes the default only if its validation accuracy at C = 64 minus full weights' has a "
                      "paired 95% interval above 0")
    result["chosen"] = "lora" if result["lora - full"][str(srv.FULL_CORES)]["low"] > 0 else "full"
    return result


def main(argv=None) -> dict:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    began = time.perf_counter()
    torch.set_num_threads(2)
    args = srv.parse_args([])
    folder = srv.run_dir(args, srv.FROM_TEACHER)
    needed = [folder / "start", folder / "final", checkpoint_path(folder, args.stage1_steps)]
    if not all(path.exists() for path in needed):
        sys.exit(f"stage2_lora: {folder} lacks make tasks-veca's kept conversion (start/, final/, the end of stage 1's "
                 "checkpoint): run `make tasks-veca` first")
    teacher, source = load_teacher_model(args.teacher)
    split = task_splits(args, "single")["train"]
    images = conversion_images(args, srv.training_sets(args, {"single": {"train": split}}))
    lora, losses, lora_time = lora_arm(args, folder, teacher, images)
    val = table_canvases(args, split)
    targets, record = teacher_targets(teacher, val), {}
    for name, model in {"full": VecaModel.from_pretrained(str(folder / "final")).float().eval(), "lora": lora}.items():
        print(f"{name}:", flush=True)
        record[name] = {"table": table_record(model, teacher, targets, val, [srv.LOW_CORES, srv.FULL_CORES], print),
                        "validation": validation_reads(args, model, split)}
    result = summary(args, folder, source, {"losses": losses, "time_s": lora_time}, record)
    result["total_time_s"] = time.perf_counter() - began
    write_json(str(OUT), result)
    for name, arm in result["arms"].items():
        print(f"{name}: " + "; ".join(f"C = {c} {a['accuracy']['mean']:.3f} [{a['accuracy']['low']:.3f}, "
                                      f"{a['accuracy']['high']:.3f}]" for c, a in arm["validation"].items())
              + f"; mean block error at C = 64 {arm['transfer_error_mean']['student_c64']:.3f}; patch cosine "
              f"{arm['final_cosines']['patch_cosine']:.3f}")
    difference = result["lora - full"][str(srv.FULL_CORES)]
    print(f"lora - full at C = 64: {difference['mean']:+.3f} [{difference['low']:+.3f}, {difference['high']:+.3f}]; "
          f"chosen: {result['chosen']} ({result['total_time_s'] / 60:.1f} min)")
    return result

if __name__ == "__main__":
    sys.exit(0 if main() else 1)
