"""Training at scale, as far as a CPU shows it: precision (the accelerate config's, float32 targets, a bf16 teacher),
gradient checkpointing, and launches that accelerate cannot honour here refused in one line."""

import io
import json
import os
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch
from conftest import ROOT, count_calls, kill_processes_naming, lookwhere_args, read_metrics, veca_args
from PIL import Image
from safetensors.torch import load_file
from transformers import AutoModel

from corevision_hf.images import IMAGENET_MEAN, IMAGENET_STD
from training import data, distill_lookwhere, distill_veca
from training import teacher as teacher_module
from training.data import BatchStream, build_dataset
from training.teacher import run_teacher, teacher_targets_and_map


def test_a_bf16_lookwhere_run_keeps_its_map_target_in_float32(teacher_dir, image_dir, tmp_path):
    distill_lookwhere.main(lookwhere_args(teacher_dir, image_dir, tmp_path, "--max-steps", "3",
                                          "--mixed-precision", "bf16"))
    assert all(m["map_kl"] >= 0 for m in read_metrics(tmp_path))  # a KL between two distributions
    assert json.loads((tmp_path / "final" / "training_recipe.json").read_text())["mixed_precision"] == "bf16"
    teacher = AutoModel.from_pretrained(teacher_dir).eval()
    images = torch.randn(3, 3, 32, 32)
    plain = teacher_targets_and_map(teacher, images, (4, 4))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as the loop runs the loss
        under_autocast = run_teacher(lambda chunk: teacher_targets_and_map(teacher, chunk, (4, 4)), images, 2)
    for ours, reference in zip(under_autocast, plain):
        assert ours.dtype == torch.float32
        torch.testing.assert_close(ours, reference, atol=1e-6, rtol=0)


@pytest.mark.parametrize("flag, expected", [([], "bf16"), (["--mixed-precision", "no"], "no")])
def test_mixed_precision_is_the_accelerate_configs_unless_a_flag_says_otherwise(teacher_dir, image_dir, tmp_path,
                                                                                monkeypatch, flag, expected):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")  # what `accelerate launch` sets from a config's value
    distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path, "--max-steps", "1", *flag))
    recipe = json.loads((tmp_path / "final" / "training_recipe.json").read_text())
    assert recipe["mixed_precision"] == expected


def test_a_bf16_teacher_holds_bf16_weights_and_gives_float32_targets(teacher_dir, image_dir, tmp_path, monkeypatch):
    loaded = []
    load = teacher_module.load_teacher

    def recorded(name, dtype=torch.float32):
        loaded.append(load(name, dtype))
        return loaded[-1]

    monkeypatch.setattr(teacher_module, "load_teacher", recorded)
    distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path, "--max-steps", "2", "--teacher-dtype", "bf16"))
    assert {p.dtype for p in loaded[0].parameters()} == {torch.bfloat16}
    metrics = read_metrics(tmp_path)
    assert len(metrics) == 2 and all(torch.isfinite(torch.tensor(m["loss"])) for m in metrics)


@pytest.mark.parametrize("method", ["veca", "lookwhere"])
def test_gradient_checkpointing_trains_to_the_same_weights(teacher_dir, image_dir, tmp_path, method):
    script, make_args = {"veca": (distill_veca, veca_args), "lookwhere": (distill_lookwhere, lookwhere_args)}[method]
    for name, extra in [("plain", []), ("checkpointed", ["--gradient-checkpointing"])]:
        script.main(make_args(teacher_dir, image_dir, tmp_path / name, "--max-steps", "2", *extra))
    plain = load_file(tmp_path / "plain" / "final" / "model.safetensors")
    checkpointed = load_file(tmp_path / "checkpointed" / "final" / "model.safetensors")
    for name, tensor in plain.items():
        torch.testing.assert_close(checkpointed[name], tensor, atol=1e-6, rtol=0, msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("cpu", [True, False])
def test_an_fsdp_config_on_cpu_processes_is_refused(teacher_dir, image_dir, tmp_path, cpu):
    """accelerate runs an FSDP config on CPU processes as plain DDP (ACCELERATE_USE_CPU=1), or as one process per
    launched process (without it): either way one line, and nothing written."""
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "training/configs/fsdp.yaml",
               "--num_processes", "2", "-m", "training.distill_veca",
               *veca_args(teacher_dir, image_dir, tmp_path / "run", "--max-steps", "1")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **({"ACCELERATE_USE_CPU": "1"} if cpu else {})}
    try:
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    finally:
        kill_processes_naming(tmp_path)
    assert result.returncode != 0
    assert "error: The accelerate config asks for FSDP, which accelerate does not do on cpu processes" in result.stderr
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------ data at scale

GRAY_SIZE = 16


def gray_jpeg(level: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (24, 24), (level, level, level)).save(buffer, "JPEG", quality=100)
    return buffer.getvalue()


def write_shards(folder, images_per_shard: list[int], extension: str = "jpg") -> list[int]:
    """webdataset shards (`{key}.jpg` and `{key}.cls` per sample) of uniform gray images, one level per image: the
    level tells which image a crop came from. Returns the levels, in order."""
    folder.mkdir(parents=True)
    levels, next_level = [], 8
    for shard, count in enumerate(images_per_shard):
        with tarfile.open(folder / f"shard-{shard:03d}.tar", "w") as tar:
            for _ in range(count):
                key = f"sample{next_level:03d}"
                image = gray_jpeg(next_level) if extension == "jpg" else b"a caption"
                for name, payload in [(f"{key}.{extension}", image), (f"{key}.cls", b"0")]:
                    info = tarfile.TarInfo(name)
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
                levels.append(next_level)
                next_level += 16
    return levels


def seen_levels(dataset, epoch: int = 0) -> list[int]:
    """The gray level of every image of one epoch, in the order read (the crop of a uniform image is uniform)."""
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    levels = []
    for batch in BatchStream(dataset, 1, seed=0).epoch(epoch):
        for pixels in batch["pixel_values"]:
            levels.append(round(((pixels * std + mean) * 255).mean().item() / 16 - 0.5) * 16 + 8)
    return levels


@pytest.mark.parametrize("shards", [[2, 2], [2, 2, 1]])
def test_webdataset_shards_are_read_once_over_two_processes(tmp_path, shards):
    """Shards that divide by the processes and shards that do not: every example read by exactly one process."""
    levels = write_shards(tmp_path / "shards", shards)
    parts = []
    for rank in range(2):
        dataset, _ = build_dataset(str(tmp_path / "shards"), streaming=True, image_size=GRAY_SIZE, process_index=rank,
                                   num_processes=2)
        parts.append(seen_levels(dataset))
    assert sorted(parts[0] + parts[1]) == levels  # the union is the dataset, nothing twice
    assert parts[0] and parts[1]
    whole, _ = build_dataset(str(tmp_path / "shards"), image_size=GRAY_SIZE)  # map-style reads them too
    assert sorted(seen_levels(whole)) == levels


def test_webdataset_shards_without_images_are_one_clear_error(tmp_path):
    write_shards(tmp_path / "shards", [2], extension="txt")
    with pytest.raises(ValueError, match=r"no 'image' column \(columns: .*txt.*\): name the column .* --image-column"):
        build_dataset(str(tmp_path / "shards"), streaming=True, image_size=GRAY_SIZE)


@pytest.mark.parametrize("case", ["truncated", "empty"])
def test_a_truncated_shard_or_shards_without_files_are_one_clear_error(tmp_path, case):
    write_shards(tmp_path / "shards", [3] if case == "truncated" else [0, 0])
    if case == "truncated":  # cut inside its second image, as an interrupted copy leaves it
        shard = tmp_path / "shards" / "shard-000.tar"
        shard.write_bytes(shard.read_bytes()[:1500])
    message = (r"The shard .*shard-000.tar cannot be read \(unexpected end of data\): it is truncated or not a tar "
               "file; copy it again or remove it." if case == "truncated" else
               r"The 2 shard\(s\) of .*shards hold no files: write images into them, or give another --data.")
    for streaming in (False, True):
        with pytest.raises(ValueError, match=message):
            build_dataset(str(tmp_path / "shards"), streaming=streaming, image_size=GRAY_SIZE)


def test_a_stream_is_shuffled_from_its_first_pass(tmp_path):
    """A class-sorted stream (here: levels in increasing order) is not read in its stored order in epoch 0."""
    levels = write_shards(tmp_path / "shards", [8, 8])
    dataset, _ = build_dataset(str(tmp_path / "shards"), streaming=True, image_size=GRAY_SIZE, shuffle_buffer=8)
    first = seen_levels(dataset, epoch=0)
    assert sorted(first) == levels and first != levels
    assert seen_levels(dataset, epoch=1) != first  # each epoch its own order
    assert seen_levels(dataset, epoch=0) == first  # and the same again for the same epoch


def test_a_folder_is_listed_once_and_the_listing_reused(image_dir, tmp_path, monkeypatch):
    listing = tmp_path / "image_files.json"
    first, _ = build_dataset(image_dir, image_size=GRAY_SIZE, listing=str(listing))
    assert json.loads(listing.read_text())["files"] == sorted(str(p) for p in Path(image_dir).rglob("*.jpg"))

    def not_again(*args, **kwargs):
        raise AssertionError("listed again")

    monkeypatch.setattr(data, "image_files", not_again)
    again, _ = build_dataset(image_dir, image_size=GRAY_SIZE, listing=str(listing))
    assert len(again) == len(first)


def test_loader_workers_live_for_the_whole_run(image_dir):
    dataset, _ = build_dataset(image_dir, image_size=GRAY_SIZE)
    stream = BatchStream(dataset, 2, seed=0, num_workers=2)
    pids = []
    for epoch in range(2):
        batches = list(stream.epoch(epoch))
        assert len(batches) == len(dataset) // 2
        pids.append(sorted(worker.pid for worker in stream.loader._iterator._workers))
    assert pids[0] == pids[1] and all(pid != os.getpid() for pid in pids[0])


def test_a_stream_cannot_be_split_over_more_processes_than_shards(tmp_path):
    write_shards(tmp_path / "shards", [3])
    with pytest.raises(ValueError, match="streams as 1 shards, fewer than the 2 processes"):
        build_dataset(str(tmp_path / "shards"), streaming=True, image_size=GRAY_SIZE, process_index=1, num_processes=2)


def test_shuffle_buffer_0_with_streaming_is_refused(teacher_dir, image_dir, tmp_path):
    with pytest.raises(ValueError, match="--shuffle-buffer must be 1 or more with --streaming"):
        distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path / "run", "--max-steps", "1", "--streaming",
                                    "--shuffle-buffer", "0"))
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_compiled_training_makes_one_graph_for_all_budgets_and_sizes(teacher_dir, image_dir, tmp_path, monkeypatch):
    """With the launch's dynamo backend (aot_eager here, inductor on a GPU), budgets and sizes are symbols from the
    first step: 12 steps over 7 budgets and 3 sizes make one training graph, one for budget 1 (torch specialises 0 and
    1) and one in eval mode for the validation; without them, a graph per budget and size until the recompile limit."""
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "AOT_EAGER")
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path, "--max-steps", "12", "--resolutions",
                                "16:1,24:1,32:1", "--eval-every", "12", "--eval-data", image_dir, "--num-workers", "0"))
    metrics = read_metrics(tmp_path)
    assert len({m["num_cores"] for m in metrics}) >= 6 and len({m["resolution"] for m in metrics}) == 3
    assert counters["stats"]["unique_graphs"] <= 3
    torch._dynamo.reset()


@pytest.mark.slow
def test_fsdp2_on_two_cpu_processes_matches_one_process(tmp_path):
    """tests.fsdp_check under torchrun: both students sharded with FSDP2 (gloo) give one process's loss, gradients
    and optimiser step; a sharded checkpoint loads back, and the gathered export equals the sharded weights."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "tests.fsdp_check",
               str(tmp_path)]
    try:
        result = subprocess.run(command, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                                text=True, timeout=300)
    finally:
        kill_processes_naming(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    assert result.stdout.count("same loss, gradients, step and checkpoint") == 4  # 2 models x 2 processes


@pytest.mark.slow
def test_two_machines_on_localhost_train_as_one_run(teacher_dir, image_dir, tmp_path):
    """Two launchers, machine ranks 0 and 1 of 2 (one CPU process each, as `accelerate launch --num_machines 2` on two
    hosts sharing the output folder): one run, the data split between them, the draws checked equal."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    args = veca_args(teacher_dir, image_dir, tmp_path / "run", "--max-steps", "3", "--num-workers", "0")
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    launchers = [
        subprocess.Popen([sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                          "training/configs/cpu_2proc.yaml", "--num_machines", "2", "--num_processes", "2",
                          "--machine_rank", str(rank), "--main_process_ip", "127.0.0.1", "--main_process_port", port,
                          "-m", "training.distill_veca", *args], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
        for rank in range(2)
    ]
    try:
        codes = [launcher.wait(timeout=300) for launcher in launchers]
    finally:
        kill_processes_naming(tmp_path)
    assert codes == [0, 0], [launcher.stderr.read()[-2000:] for launcher in launchers]
    metrics = read_metrics(tmp_path / "run")
    assert [len(set(m["num_cores_all_processes"])) for m in metrics] == [1, 1, 1]
    assert [round(m["images_per_s"] * m["step_time_s"]) for m in metrics] == [4, 4, 4]  # batch 2 on each machine
    assert json.loads((tmp_path / "run" / "final" / "training_recipe.json").read_text())["num_processes"] == 2


def test_lookwhere_serves_teacher_targets_and_map_from_the_cache(teacher_dir, image_dir, tmp_path, monkeypatch):
    """8 images, batch 2: 4 steps an epoch; 12 steps with crops repeating every epoch run the teacher in the first
    epoch only, and the cached map trains as the computed one did (map_kl finite and >= 0)."""
    calls = count_calls(monkeypatch, teacher_module, "teacher_targets_and_map")
    distill_lookwhere.main(lookwhere_args(teacher_dir, image_dir, tmp_path, "--max-steps", "12", "--teacher-cache",
                                          "1", "--num-workers", "0"))
    assert len(calls) == 4
    metrics = read_metrics(tmp_path)
    assert len(metrics) == 12 and all(m["map_kl"] >= 0 for m in metrics)
    assert [m["teacher_time_share"] > 0 for m in metrics[4:]] == [False] * 8


@pytest.mark.parametrize("cut, message", [
    (2560 + 100, r"is truncated inside the header of sample024.jpg, after 2 whole files"),  # tarfile stops silently
    (2560, r"is truncated after 2 whole files \(no end-of-archive block follows them\)"),  # a member boundary
    (3072 + 300, r"is truncated inside sample024.jpg \(300 of its 643 bytes\), after 2 whole files"),
])
def test_a_shard_cut_inside_a_member_names_it(tmp_path, cut, message):
    """A copy interrupted anywhere: the member it cut is named, and how many whole files precede it; never a shard
    read as if whole (members 2560 bytes apart: sample008.jpg, sample008.cls, sample024.jpg at 2560, its data at
    3072)."""
    write_shards(tmp_path / "shards", [3])
    shard = tmp_path / "shards" / "shard-000.tar"
    shard.write_bytes(shard.read_bytes()[:cut])
    for streaming in (False, True):
        with pytest.raises(ValueError, match=rf"^The shard .*shard-000.tar {message}: copy it again or remove it.$"):
            build_dataset(str(tmp_path / "shards"), streaming=streaming, image_size=GRAY_SIZE)
