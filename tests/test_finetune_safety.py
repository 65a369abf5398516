"""python -m training.finetune keeps what a user wrote and says what is wrong in one line: --overwrite deletes only a
run of this command, class folders are read as listed (hidden ones skipped, none empty, none a link), flags are
finite numbers, and the saved processor gives the pixels the run trained and scored on. Tiny random models, a few
generated images."""

import json
import os

import numpy as np
import pytest
import torch
from conftest import tiny_veca_config
from PIL import Image
from test_finetune import arguments, folders, write_folder  # noqa: F401  (folders: the module's fixture)
from transformers import AutoImageProcessor

from corevision_hf.cli import run
from training import finetune


def refused(argv, capsys) -> str:
    """The one line a run of `argv` ends in, with exit status 2 (stderr's last line; before it, progress bars at
    most)."""
    capsys.readouterr()
    assert run(finetune.main, argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("error: ") and not any(line.startswith(("error", "Traceback", "  ")) for line in
                                                       lines[:-1]), lines
    return lines[-1]


def tree(folder) -> dict:
    """{relative path: bytes} of every file under `folder`."""
    return {os.path.relpath(os.path.join(root, name), folder): open(os.path.join(root, name), "rb").read()
            for root, _, names in os.walk(folder) for name in names}


# --overwrite and the output folder


def test_overwrite_refuses_a_folder_holding_anything_a_run_does_not_write(folders, tmp_path, capsys):
    argv = arguments(folders, "veca", tmp_path / "run", "--epochs", "0")
    finetune.main(argv)
    (tmp_path / "run" / "logs").mkdir()
    (tmp_path / "run" / "logs" / "notes.txt").write_text("mine")
    before = tree(tmp_path / "run")
    for extra in ([], ["--overwrite"]):  # refused every time, not once and then deleted
        error = refused([*argv, *extra], capsys)
        assert "holds a run of training.finetune and also logs, which no run writes there" in error
        assert "nothing was deleted" in error
        assert tree(tmp_path / "run") == before
    os.remove(tmp_path / "run" / "logs" / "notes.txt")
    os.rmdir(tmp_path / "run" / "logs")
    assert finetune.main([*argv, "--overwrite"])["best_epoch"] == 0  # a run's own files alone: replaced


def test_overwrite_keeps_what_a_user_added_inside_best_or_final(folders, tmp_path, capsys):
    """Notes in best/ and an ONNX export under final/onnx/ are not the run's: --overwrite deleted best/ and final/
    whole. Every file a run writes is listed with its sha256 (OUT's manifest, and each folder's), so a file listed
    nowhere, or edited since, stops it, named, before anything is deleted."""
    argv = arguments(folders, "veca", tmp_path / "run", "--epochs", "0", "--eval-data", folders["heldout"])
    finetune.main(argv)
    (tmp_path / "run" / "final" / "onnx").mkdir()
    (tmp_path / "run" / "final" / "onnx" / "model.onnx").write_bytes(b"an export of mine")
    (tmp_path / "run" / "best" / "notes.md").write_text("mine")
    before = tree(tmp_path / "run")
    error = refused([*argv, "--overwrite"], capsys)
    assert "holds best/notes.md, final/onnx/model.onnx, which no run wrote there (or which changed since)" in error
    assert "Nothing was deleted" in error and tree(tmp_path / "run") == before
    os.remove(tmp_path / "run" / "best" / "notes.md")
    with open(tmp_path / "run" / "final" / "README.md", "a") as f:
        f.write("my notes on the card")  # a file of the run's that the user changed is theirs now
    os.remove(tmp_path / "run" / "final" / "onnx" / "model.onnx")
    assert "holds final/README.md, which no run wrote there (or which changed since)" in refused(
        [*argv, "--overwrite"], capsys)
    os.remove(tmp_path / "run" / "final" / "README.md")
    assert finetune.main([*argv, "--overwrite"])["best_epoch"] == 0  # the run's own files alone: replaced
    assert not (tmp_path / "run" / "final" / "onnx").exists()  # an empty folder of the user's is no file to keep


def test_a_hand_written_run_json_is_not_a_run(folders, tmp_path, capsys):
    """{"script": "training.finetune"} written by hand was all --overwrite needed to delete a user's best/ beside it."""
    (tmp_path / "out" / "best").mkdir(parents=True)
    (tmp_path / "out" / "best" / "weights.bin").write_bytes(b"mine")
    (tmp_path / "out" / "run.json").write_text(json.dumps({"script": "training.finetune"}))
    error = refused(arguments(folders, "veca", tmp_path / "out", "--epochs", "0", "--overwrite"), capsys)
    assert "holds none (no run.json that a run of it wrote" in error and "nothing was deleted" in error
    assert (tmp_path / "out" / "best" / "weights.bin").read_bytes() == b"mine"


def test_overwrite_refuses_a_folder_no_run_of_this_command_wrote(folders, tmp_path, capsys):
    """A class folder named best/ (an --output-dir pointed at data) or a run.json of another script is not a run."""
    (tmp_path / "out" / "best").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "out" / "best" / "photo.png")
    argv = arguments(folders, "veca", tmp_path / "out", "--epochs", "0", "--overwrite")
    assert "holds none (no run.json that a run of it wrote, listed in .corevision_hf.json, but best)" in refused(
        argv, capsys)
    (tmp_path / "out" / "run.json").write_text(json.dumps({"script": "training.distill_veca", "args": {}}))
    assert "holds none" in refused(argv, capsys)
    assert (tmp_path / "out" / "best" / "photo.png").is_file()


def test_overwrite_never_deletes_through_a_link(folders, tmp_path, capsys):
    argv = arguments(folders, "veca", tmp_path / "run", "--epochs", "0")
    finetune.main(argv)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "keep.txt").write_text("mine")
    os.rename(tmp_path / "run" / "best", tmp_path / "old_best")
    os.symlink(tmp_path / "mine", tmp_path / "run" / "best")
    assert "and also best, which no run writes there (or a link): nothing" in refused([*argv, "--overwrite"], capsys)
    assert (tmp_path / "mine" / "keep.txt").read_text() == "mine"


def test_a_new_run_refuses_a_folder_of_other_files_and_a_file(folders, tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    error = refused(arguments(folders, "veca", tmp_path / "out", "--epochs", "0"), capsys)
    assert "already holds files of its own (notes.txt)" in error and "--overwrite" not in error
    (tmp_path / "file").write_text("mine")
    error = refused(arguments(folders, "veca", tmp_path / "file", "--epochs", "0"), capsys)
    assert f"--output-dir {tmp_path / 'file'} is a file: give a new or empty folder." in error
    assert sorted(os.listdir(tmp_path / "out")) == ["notes.txt"] and (tmp_path / "file").read_text() == "mine"


@pytest.mark.parametrize("flag, inside", [("--data", ""), ("--data", "runs/one"), ("--eval-data", "out")])
def test_an_output_folder_inside_a_data_folder_is_refused(folders, tmp_path, capsys, flag, inside):
    data = {"--data": folders["train"], "--eval-data": folders["heldout"]}[flag]
    output = os.path.join(data, inside) if inside else data
    before = tree(data)
    error = refused(arguments(folders, "veca", output, "--epochs", "0"), capsys)
    assert f"is inside {flag} {data}" in error
    assert tree(data) == before and not os.path.exists(os.path.join(data, "runs"))


def test_a_link_planted_at_a_json_the_run_writes_is_replaced_not_followed(tmp_path):
    (tmp_path / "target.txt").write_text("mine")
    os.symlink(tmp_path / "target.txt", tmp_path / "heldout.json")
    os.symlink(tmp_path / "target.txt", tmp_path / "heldout.json.tmp")  # the fixed temporary name of old
    finetune.write_json(str(tmp_path / "heldout.json"), {"accuracy": 1.0})
    assert (tmp_path / "target.txt").read_text() == "mine"
    assert not (tmp_path / "heldout.json").is_symlink()
    assert json.loads((tmp_path / "heldout.json").read_text()) == {"accuracy": 1.0}
    assert sorted(os.listdir(tmp_path)) == ["heldout.json", "heldout.json.tmp", "target.txt"]  # no temporary left


# class folders


def test_hidden_folders_are_skipped(tmp_path):
    data = write_folder(tmp_path / "data", 2, seed=0)
    (tmp_path / "data" / ".ipynb_checkpoints").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "data" / ".ipynb_checkpoints" / "x.png")
    (tmp_path / "data" / "dark" / ".ipynb_checkpoints").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "data" / "dark" / ".ipynb_checkpoints" / "0-checkpoint.png")
    for train in (True, False):
        examples, classes = finetune.labelled_files(data, train=train)
        assert classes == ["bright", "dark"] and len(examples) == 4
        assert not any(".ipynb_checkpoints" in path for path, _ in examples)


def test_an_empty_class_folder_and_a_linked_one_are_one_line_errors(folders, tmp_path, capsys):
    data = write_folder(tmp_path / "data", 3, seed=0)
    (tmp_path / "data" / "empty").mkdir()
    error = refused(arguments({**folders, "train": data}, "veca", tmp_path / "run"), capsys)
    assert f"--data: the class folder {tmp_path / 'data' / 'empty'} holds no images" in error
    os.rmdir(tmp_path / "data" / "empty")
    os.symlink(os.path.join(folders["val"], "dark"), tmp_path / "data" / "linked")
    error = refused(arguments({**folders, "train": data}, "veca", tmp_path / "run"), capsys)
    assert f"--data: {tmp_path / 'data' / 'linked'} is a symbolic link, and a run never follows one" in error
    assert not (tmp_path / "run").exists()


# flags


@pytest.mark.parametrize("flag, value", [
    ("--lr", "nan"), ("--lr", "inf"), ("--max-grad-norm", "nan"), ("--max-grad-norm", "inf"), ("--weight-decay", "nan"),
    ("--weight-decay", "-0.5"), ("--layer-decay", "nan"), ("--warmup-epochs", "inf"), ("--warmup-epochs", "-1"),
    ("--eval-k-ratio", "nan"), ("--val-fraction", "nan"), ("--grayscale", "inf"), ("--lr", "0"), ("--epochs", "-1"),
    ("--batch-size", "0"), ("--threads", "0"),
])
def test_every_number_flag_refuses_non_finite_and_out_of_range_values(folders, tmp_path, capsys, flag, value):
    error = refused(arguments(folders, "lookwhere", tmp_path / "run", flag, value), capsys)
    assert error.startswith(f"error: argument {flag}: must be ") and f"got '{value}'" in error
    assert not (tmp_path / "run").exists()


def test_a_missing_checkpoint_folder_says_so(folders, tmp_path, capsys):
    argv = arguments(folders, "veca", tmp_path / "run")
    error = refused([str(tmp_path / "no" / "such" / "model"), *argv[1:]], capsys)
    assert f"The checkpoint folder {tmp_path / 'no' / 'such' / 'model'} does not exist" in error
    assert "Repo id" not in error


def broken_copy(source: str, root) -> str:
    """A copy of the ImageFolder `source` with one more file in dark/ that is no image."""
    import shutil

    shutil.copytree(source, root)
    (root / "dark" / "broken.png").write_bytes(b"not a png")
    return str(root)


def test_a_broken_held_out_image_is_refused_before_training(folders, tmp_path, capsys):
    heldout = broken_copy(folders["heldout"], tmp_path / "heldout")
    error = refused(arguments({**folders, "heldout": heldout}, "veca", tmp_path / "run"), capsys)
    assert error.startswith(f"error: --eval-data: {heldout}/dark/broken.png cannot be read as an image")
    assert not (tmp_path / "run").exists()  # before anything was written, let alone trained


def test_a_broken_training_image_read_by_a_worker_is_one_line(folders, tmp_path, capsys):
    data = broken_copy(folders["train"], tmp_path / "train")
    error = refused(arguments({**folders, "train": data}, "veca", tmp_path / "run", "--num-workers", "1"), capsys)
    assert error.startswith(f"error: {data}/dark/broken.png cannot be read as an image")
    assert "Traceback" not in error and "worker" not in error


# the recipe, augmentations, threads and progress


def test_the_recipe_sets_its_flags_the_command_line_wins_and_both_are_shown(folders, tmp_path, capsys):
    argv = arguments(folders, "lookwhere", tmp_path / "run", "--recipe", "finetune-final", "--image-size", "32",
                     "--epochs", "1", "--threads", "1")
    threads = torch.get_num_threads()
    try:
        result = finetune.main(argv)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    recorded = json.loads((tmp_path / "run" / "run.json").read_text())["args"]
    assert (recorded["layer_decay"], recorded["crop_scale"], recorded["wise_ft"]) == (0.75, "0.25:1", "0.25,0.5,0.75")
    assert (recorded["image_size"], recorded["epochs"], recorded["lr"]) == (32, 1, 1e-3)  # given: they win
    assert result["evaluated"] == "final"
    line = ("--recipe finetune-final (training/recipes/finetune-final.yaml): --layer-decay 0.75 --eval-k-ratio 0.5 "
            "--probe-weight-decay 1e-2,1e-1,1,10 --crop-scale 0.25:1 --wise-ft 0.25,0.5,0.75 --evaluate final; "
            "changed on the command line: --image-size 32 --epochs 1 --lr 0.001 --k-ratio 0.25:0.75")
    assert f"recipe: {line}\n" in out and f"Preset: `{line}`." in (tmp_path / "run" / "final" / "README.md").read_text()
    assert "linear probe, training features: 16 images read (4/4 batches)\n" in out  # progress of the probe


def test_the_recipe_is_the_command_of_the_published_result():
    """Every flag the recipe sets is the value in the commands of
    experiments/finetune_rotation/results/finetune_rotation_gcompris.json, the result docs/fine-tuning.md leads with
    (--evaluate final: the experiment scored final/ of those runs)."""
    import shlex
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    result = root / "experiments" / "finetune_rotation" / "results" / "finetune_rotation_gcompris.json"
    pairs = json.loads(result.read_text())["pairs"]
    for pair in pairs.values():
        words = shlex.split(pair["fine_tuned"]["command"])[3:]
        given = finetune.parse_args(words)
        recipe = finetune.parse_args(["checkpoint", "--data", "d", "--output-dir", "o", "--eval-data", "e",
                                      "--recipe", "finetune-final"])
        assert pair["fine_tuned"]["weights"] == "final" and recipe.evaluate == "final"
        for name in ("image_size", "epochs", "lr", "layer_decay", "k_ratio", "eval_k_ratio", "probe_weight_decay",
                     "crop_scale", "wise_ft", "hflip", "grayscale", "weight_decay", "max_grad_norm", "warmup_epochs",
                     "batch_size"):
            assert getattr(recipe, name) == getattr(given, name), name


def test_augmentations_are_printed_and_carded(folders, tmp_path, capsys):
    finetune.main(arguments(folders, "veca", tmp_path / "run", "--epochs", "0", "--no-hflip"))
    assert "augmentations of the training images: none\n" in capsys.readouterr().out
    assert "Augmentations of the training images: none." in (tmp_path / "run" / "best" / "README.md").read_text()
    args = finetune.parse_args(["c", "--data", "d", "--output-dir", "o", "--crop-scale", "0.5:1"])
    assert finetune.augmentations(args).startswith("left-right flips of half the images (--no-hflip where")
    assert "; square crops of 0.5 to 1 of the side" in finetune.augmentations(args)


# the saved processor


def test_the_saved_processor_gives_the_pixels_the_run_fed_the_model(folders, tmp_path, monkeypatch):
    """On photos that are not square, the folder's processor (as a pipeline loads it) gives exactly the pixels of the
    batches the command trained and scored on: squashed to --image-size squared, not its aspect kept."""
    rng = np.random.default_rng(0)
    for label, name in enumerate(("bright", "dark")):
        (tmp_path / "wide" / name).mkdir(parents=True)
        for index in range(5):
            pixels = rng.integers(96 * (1 - label), 96 * (1 - label) + 160, size=(24, 56, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "wide" / name / f"{index}.png")
    made, real_loader = [], finetune.loader
    monkeypatch.setattr(finetune, "loader", lambda examples, *args, **kwargs: made.append(
        (examples, real_loader(examples, *args, **kwargs))) or made[-1][1])
    finetune.main(arguments({**folders, "train": str(tmp_path / "wide")}, "lookwhere", tmp_path / "run",
                            "--epochs", "0", "--eval-data", folders["heldout"]))
    examples, fixed = made[1]  # the probe's batches, in file order
    fed = torch.cat([batch["pixel_values"] for batch in fixed])
    for name in ("best", "final"):
        processor = AutoImageProcessor.from_pretrained(tmp_path / "run" / name, trust_remote_code=True)
        with_processor = torch.cat([processor(Image.open(path), return_tensors="pt")["pixel_values"]
                                    for path, _ in examples])
        assert with_processor.shape == fed.shape == (len(examples), 3, 32, 32)
        assert torch.equal(with_processor, fed)


# layer-wise decay


def test_veca_coordinate_heads_train_at_the_rate_of_the_block_they_feed():
    from corevision_hf import VecaForImageClassification

    model = VecaForImageClassification(tiny_veca_config(num_labels=2))  # 2 blocks, 1 coordinate head (before block 1)
    layers = finetune.layer_indices(model)
    assert layers["veca.encoder.coordinate_heads.0.proj.weight"] == layers["veca.encoder.layers.1.mlp.fc1.weight"] == 2
    assert layers["veca.encoder.layers.0.mlp.fc1.weight"] == 1 and layers["veca.embeddings.core_bank.cores"] == 0
    groups = finetune.parameter_groups(model, 1e-3, 0.05, 0.5)
    scale = {id(param): group["lr_scale"] for group in groups for param in group["params"]}
    assert scale[id(model.veca.encoder.coordinate_heads[0].proj.weight)] == 0.5  # top is 3: 0.5 ** (3 - 2)


def test_the_result_docs_fine_tuning_leads_with_is_its_json():
    """Each row of the page's table (seed, final/ held-out, the two differences with their intervals, the probes'
    held-out accuracies in the header) is experiments/finetune_rotation/results/finetune_rotation_gcompris.json,
    rounded to 3 places."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    page = (root / "docs" / "fine-tuning.md").read_text()
    result = root / "experiments" / "finetune_rotation" / "results" / "finetune_rotation_gcompris.json"
    pairs = json.loads(result.read_text())["pairs"]

    def shown(value: float, sign: bool = True) -> str:
        return f"{value:+.3f}" if sign else f"{value:.3f}"

    for seed in range(4):
        pair = pairs[f"final_seed{seed}"]
        columns = [pair["fine_tuned_minus_probe_heldout"],
                   pair["hindsight_probes"]["1"]["fine_tuned_minus_probe_heldout"]]
        cells = [shown(pair["fine_tuned"]["heldout_accuracy"], False)] + [
            f"{shown(column['difference'])} [{shown(column['interval_95'][0])}, {shown(column['interval_95'][1])}]"
            for column in columns]
        assert f"| {seed} | {' | '.join(cells)} |" in page
    header = re.search(r"\| `--seed` \| `final/` held-out \|.*\|", page).group(0)
    assert f"held-out {shown(pairs['final_seed0']['probe']['heldout_accuracy'], False)})" in header
    assert f"held-out {shown(pairs['final_seed0']['hindsight_probes']['1']['heldout_accuracy'], False)})" in header
