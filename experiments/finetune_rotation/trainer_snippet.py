"""The Trainer snippet of docs/fine-tuning.md on a task of your choice: does its fine-tuning beat its own head?

    python -m experiments.finetune_rotation.trainer_snippet --model outputs/rotation/lookwhere-s-offline \
        --data outputs/rotation_big/train --eval-data outputs/rotation_big/heldout --output outputs/trainer_snippet.json

Runs the page's snippet as it is, its model and folders replaced by --model, --data and --eval-data and its output
folder by --output-dir: stage 1 (the head fitted on the frozen features), then stage 2 (fine-tuning). The held-out
images are predicted after each stage; the JSON holds both accuracies and the paired bootstrap of fine-tuned minus
head, resampling whole photos (the snippet's "photo" key: the file name less its crop number) as
experiments.finetune_rotation.finetune_rotation --groups does. Nothing is chosen on the held-out images: they are only
measured.
"""

import argparse
import json
import os
import re
import sys
from pathlib import Path

from corevision_hf.atomic import write_text_atomically
from corevision_hf.cli import HelpFormatter

PAGE = Path(__file__).resolve().parents[2] / "docs" / "fine-tuning.md"
STAGE_2 = "# 2."


def snippet(model: str, data: str, eval_data: str, output_dir: str) -> tuple[str, str]:
    """(stage 1, stage 2) of the page's Trainer snippet, its names replaced by the arguments."""
    blocks = [block for block in re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.DOTALL)
              if "Trainer(" in block]
    if len(blocks) != 1 or blocks[0].count(STAGE_2) != 1:
        raise RuntimeError(f"{PAGE} no longer holds one Trainer snippet with one {STAGE_2!r} line: update this script.")
    code = blocks[0]
    for name, value in (("outputs/rotation/trainer", output_dir), ("outputs/demo/lookwhere", model),
                        ("outputs/rotation/train", data), ("outputs/rotation/heldout", eval_data)):  # trainer first
        code = code.replace(f'"{name}', json.dumps(value)[:-1])
    first, second = code.split(STAGE_2)
    return first, STAGE_2 + second


def heldout_correct(namespace: dict) -> str:
    """"1" (right) or "0" for each held-out image of the snippet, predicted at its deployed budget."""
    import numpy as np

    output = namespace["trainer"](namespace["deployed"]).predict(namespace["heldout"])
    return "".join(str(int(c)) for c in np.argmax(output.predictions, -1) == output.label_ids)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m experiments.finetune_rotation.trainer_snippet",
                                     description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--model", required=True, help="a LookWhere folder (the page's outputs/demo/lookwhere)")
    parser.add_argument("--data", required=True, help="training ImageFolder (examples/rotation_task.py's train)")
    parser.add_argument("--eval-data", required=True, help="held-out ImageFolder, measured after each stage")
    parser.add_argument("--output-dir", default="outputs/trainer_snippet", help="the snippet's Trainer folder")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--output", default="outputs/trainer_snippet.json")
    args = parser.parse_args(argv)
    for flag in ("model", "data", "eval_data"):
        if not os.path.isdir(getattr(args, flag)):
            raise ValueError(f"--{flag.replace('_', '-')} {getattr(args, flag)} is no folder.")
    if os.path.exists(os.path.join(args.output_dir, "final")):
        raise ValueError(f"--output-dir {args.output_dir} already holds the snippet's final/ model: give another "
                         "folder or remove that one.")
    classes = [sorted(path.name for path in Path(folder).iterdir() if path.is_dir() and any(path.glob("*.png")))
               for folder in (args.data, args.eval_data)]
    if len(classes[0]) < 2 or classes[0] != classes[1]:
        raise ValueError(f"--data and --eval-data must hold the same class sub-folders of .png images (as "
                         f"examples/rotation_task.py writes), two or more; found {classes[0]} and {classes[1]}.")
    import torch

    from experiments.finetune_rotation.finetune_rotation import paired_bootstrap

    torch.set_num_threads(args.threads)
    first, second = snippet(args.model, args.data, args.eval_data, args.output_dir)
    namespace = {"__name__": "__trainer_snippet__"}
    exec(compile(first, f"{PAGE} (stage 1)", "exec"), namespace)
    head = heldout_correct(namespace)
    exec(compile(second, f"{PAGE} (stage 2)", "exec"), namespace)
    tuned = heldout_correct(namespace)
    photos = [example["photo"] for example in namespace["heldout"]]
    result = {
        "command": (" ".join(["python", "-m", "experiments.finetune_rotation.trainer_snippet", *sys.argv[1:]])
                    if argv is None else None),
        "head_heldout_accuracy": head.count("1") / len(head),
        "finetuned_heldout_accuracy": tuned.count("1") / len(tuned),
        "finetuned_minus_head": paired_bootstrap(tuned, head, 2000, 0, photos),
        "head_correct": head, "finetuned_correct": tuned,
    }
    bootstrap = result["finetuned_minus_head"]
    print(f"held-out accuracy: head {result['head_heldout_accuracy']:.4f}, fine-tuned "
          f"{result['finetuned_heldout_accuracy']:.4f}; fine-tuned - head {bootstrap['difference']:+.4f}, 95% interval "
          f"[{bootstrap['interval_95'][0]:+.4f}, {bootstrap['interval_95'][1]:+.4f}] ({bootstrap['groups']} photos)")
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    write_text_atomically(args.output, json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    try:
        main()
    except (Exception, KeyboardInterrupt) as error:
        from corevision_hf.cli import exit_status

        sys.exit(exit_status(error))
