"""benchmarks/distill_quality.py and the evaluation modules it reads: its intervals and paired ratios checked by hand,
its reference lines and guards, and its smoke mode end to end (the benchmark itself trains sixteen students for about
an hour)."""

import json
import math
import shutil
import statistics

import pytest
import torch
from transformers import Dinov2Config, Dinov2Model

from benchmarks import distill_quality as dq
from benchmarks import quality_stats as qs
from evaluation.lookwhere_features import chosen_features
from evaluation.photo_agreement import PhotoSet, constant_agreement
from evaluation.quality_students import ELASTIC_BUDGETS, STUDENTS, budgets_of, gflops, new_student
from evaluation.quality_training import seeding_crops, teacher_cache
from evaluation.quality_training import cached_targets
from evaluation.selections import centre_scores
from evaluation.teachers import equal_flops_resolution, load_teacher_model
from training.data import HELDOUT_PHOTOS, VAL_PHOTOS
from training.teacher import teacher_targets_and_map


# ---------------------------------------------------------------------------------------------------- statistics


@pytest.mark.parametrize("df, quantile", [(1, 12.7062), (2, 4.3027), (5, 2.5706), (20, 2.0860), (math.inf, 1.9600)])
def test_t_quantiles_are_the_tables(df, quantile):
    assert qs.t_quantile(0.975, df) == pytest.approx(quantile, abs=1e-4)
    assert qs.t_cdf(qs.t_quantile(0.975, df), df) == pytest.approx(0.975, abs=1e-9) if math.isfinite(df) else True


def test_interval_adds_the_photo_and_seed_terms_with_satterthwaite_df():
    # seeds x photos; per-photo means 2, 3, 4 (variance 1), per-seed means 2, 4 (variance 2)
    result = qs.mean_interval([[1.0, 2.0, 3.0], [3.0, 4.0, 5.0]])
    photos, seeds = 1 / 3, 2 / 2  # variances of the mean, with 2 and 1 df
    df = (photos + seeds) ** 2 / (photos**2 / 2 + seeds**2 / 1)
    assert result["mean"] == pytest.approx(3.0)
    assert result["se"] == pytest.approx(math.sqrt(photos + seeds))
    assert result["df"] == pytest.approx(df)
    assert result["half_width"] == pytest.approx(qs.t_quantile(0.975, df) * math.sqrt(photos + seeds))
    assert (result["low"], result["high"]) == pytest.approx((3 - result["half_width"], 3 + result["half_width"]))
    assert result["terms"] == pytest.approx({"photos": math.sqrt(photos), "seeds": math.sqrt(seeds)})


def test_one_seed_is_the_photo_term_on_photos_minus_one_df():
    result = qs.mean_interval([[1.0, 2.0, 3.0]])
    assert (result["mean"], result["se"], result["df"]) == pytest.approx((2.0, math.sqrt(1 / 3), 2))
    assert result["half_width"] == pytest.approx(4.3027 * math.sqrt(1 / 3), abs=1e-4)


def test_rerun_drift_is_a_term_of_its_own_with_one_df():
    first, second = [0.50, 0.60, 0.70], [0.48, 0.58, 0.68]  # the same student trained twice: d = 0.02
    drift = qs.drift_variance(first, second)
    assert drift == pytest.approx(0.02**2 / 2)
    result = qs.mean_interval([[1.0, 2.0, 3.0], [3.0, 4.0, 5.0]], drift)
    assert result["terms"]["drift"] == pytest.approx(math.sqrt(drift / 2))  # averaged over the two seeds
    assert result["se"] ** 2 == pytest.approx(1 / 3 + 1 + drift / 2)


def test_paired_ratio_by_hand():
    # A - 1.05 B = [[-0.15, 0.05], [-0.05, 0.15]]: photo means -0.1, 0.1 (variance 0.02), seed means -0.05, 0.05
    # (variance 0.005); over mean(B) = 1
    result = qs.paired_ratio([[0.9, 1.1], [1.0, 1.2]], [[1.0, 1.0], [1.0, 1.0]])
    assert result["mean"] == pytest.approx(1.05)
    assert result["se"] == pytest.approx(math.sqrt(0.02 / 2 + 0.005 / 2))
    df = (0.01 + 0.0025) ** 2 / (0.01**2 / 1 + 0.0025**2 / 1)
    assert result["half_width"] == pytest.approx(qs.t_quantile(0.975, df) * result["se"])


def test_paired_ratio_cancels_what_both_share_and_a_fixed_reference_serves_every_seed():
    reference = [[0.3, 0.9, 0.6], [0.5, 0.8, 0.4]]  # hard and easy photos, a good and a bad seed
    result = qs.paired_ratio([[0.9 * b for b in row] for row in reference], reference)
    assert (result["mean"], result["se"], result["half_width"]) == pytest.approx((0.9, 0.0, 0.0), abs=1e-12)
    assert qs.mean_interval(reference)["se"] > 0.1  # while each mean on its own is uncertain
    fixed = [[0.5, 0.6]]  # a baseline measured once (the constant, the teacher): the same row for both seeds
    values = [[0.55, 0.62], [0.45, 0.64]]
    assert qs.paired_ratio(values, fixed)["mean"] == pytest.approx(statistics.fmean([0.55, 0.62, 0.45, 0.64]) / 0.55)
    assert qs.paired_difference(values, fixed)["mean"] == pytest.approx(statistics.fmean([0.05, 0.02, -0.05, 0.04]))


def test_paired_ratio_carries_both_drifts():
    values, reference = [[1.0, 2.0]], [[1.0, 2.0]]  # ratio 1, nothing else varies
    result = qs.paired_ratio(values, reference, drift=0.01, reference_drift=0.04)
    assert result["se"] == pytest.approx(math.sqrt(0.01 + 0.04) / 1.5)
    assert result["df"] == pytest.approx(1)


# ---------------------------------------------------------------------------------------------------- reference lines


def teacher(tmp_path=None, hidden=32, layers=3):
    torch.manual_seed(0)
    model = Dinov2Model(Dinov2Config(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
                                     intermediate_size=2 * hidden, patch_size=14, image_size=56))
    if tmp_path is not None:
        model.save_pretrained(tmp_path / "teacher")
    return model.eval()


def test_the_teacher_at_equal_flops_never_costs_more_than_the_student():
    model = teacher()
    costs = {size: gflops(model, size, {}) for size in (14, 28, 42, 56)}
    assert equal_flops_resolution(model, costs[42], 56) == 42
    assert equal_flops_resolution(model, (costs[42] + costs[56]) / 2, 56) == 42
    assert equal_flops_resolution(model, costs[14] / 2, 56) == 14  # at least one patch
    assert equal_flops_resolution(model, 10 * costs[56], 56) == 56  # at most the size measured: agrees with itself


def test_the_constant_predictor_is_the_same_for_every_photo_and_patch():
    constant = (torch.tensor([1.0, 1.0]), torch.tensor([1.0, 0.0]))
    photos = PhotoSet.__new__(PhotoSet)  # the scoring alone, on hand-made targets
    photos.targets = {28: (torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.ones(2, 4, 2))}
    photos.paths, photos.centre = ["a", "b"], constant
    values = constant_agreement(constant, photos, 28)
    assert values["cls"] == pytest.approx([2**-0.5, 2**-0.5])
    assert values["patch"] == pytest.approx([2**-0.5, 2**-0.5])
    assert values["cls_centred"] == values["patch_centred"] == values["patch_r2"] == [0.0, 0.0]  # the centre itself


# ---------------------------------------------------------------------------------------------------- the run


def test_smoke_run_writes_every_baseline_beside_the_students(tmp_path, capsys):
    held_out = tmp_path / "held_out"
    held_out.mkdir()
    for photo in sorted(VAL_PHOTOS.glob("*.jpg"))[:4]:  # stand-ins: the test only checks the plumbing
        shutil.copy(photo, held_out)
    teacher(tmp_path)
    out, plot = tmp_path / "quality.json", tmp_path / "quality.png"
    result = dq.main(["--smoke", "--teacher", str(tmp_path / "teacher"), "--scratch-dir", str(tmp_path / "scratch"),
                      "--heldout-photos", str(held_out), "--out", str(out), "--plot", str(plot)])
    assert json.loads(out.read_text())["command"].startswith("python -m benchmarks.distill_quality --smoke")
    assert plot.stat().st_size > 0
    printed = capsys.readouterr().out  # issue #46: the minutes of teacher targets print progress, per seed
    assert "teacher targets, seed 0: crop epoch" in printed and "teacher targets, seed 1: crop epoch" in printed
    assert result["same_data_for_all_students_of_a_seed"]
    assert set(result["results"]) == {"28", "56"}
    interval_keys = {"mean", "se", "df", "half_width", "low", "high"}
    for block in result["results"].values():
        baselines = block["baselines"]
        assert set(baselines) == {"constant", "teacher_equal_flops", "init"}
        entries = [baselines["constant"], *baselines["teacher_equal_flops"].values(), *baselines["init"].values()]
        assert all(interval_keys <= set(entry[m]) for entry in entries for m in ("cls", "patch"))
        assert {key.split("/")[0] for key in baselines["init"]} == {
            "VECA", "VECA from teacher", "dense ViT", "LookWhere-S random", "LookWhere-S from teacher"}
        students = {(s["student"], s["setting"]) for s in block["students"]}
        assert ("VECA fixed-4", "cores=1") in students and ("LookWhere-S random init", "k_ratio=0.1") in students
        for row in block["students"]:
            assert set(row["ratios"]) == {"constant", "teacher_equal_flops", "init"}
            assert str(row["teacher_equal_flops_resolution"]) in baselines["teacher_equal_flops"]
            assert len(row["cls"]["per_seed_per_photo"]) == 2  # two seeds
    # The init lines are the students before their first step, measured again here; "dense ViT" and the two "from
    # teacher" students name both a student and its initialisation, and the trained student must not stand in for it.
    args = dq.parse_args(["--smoke", "--heldout-photos", str(held_out)])
    model, _ = load_teacher_model(str(tmp_path / "teacher"))
    photos = PhotoSet(held_out, model, args.resolutions, args.image_size, args)
    # VECA from the teacher starts as the copy with its bank seeded from seed 1's first crops
    seeding = seeding_crops(tmp_path / "scratch" / "train_photos", args, 1,
                            teacher_cache(tmp_path / "elsewhere", 1, args, "", []))
    for name, init, label in (("dense ViT", "dense ViT", "all"), ("VECA from teacher", "VECA from teacher", "cores=1"),
                              ("LookWhere-S from teacher", "LookWhere-S from teacher", "k_ratio=0.1")):
        start = photos.measure(new_student(name, model, args, 1, seeding)[0], [(label, budgets_of(name)[0][1])])[label]
        for r, block in result["results"].items():
            line = block["baselines"]["init"][f"{init}/{label}"]["patch"]["per_seed_per_photo"][1]
            trained = next(row for row in block["students"] if row["student"] == name and row["setting"] == label)
            assert line == pytest.approx(start["agreement"][int(r)]["patch"], abs=1e-5)
            assert line != pytest.approx(trained["patch"]["per_seed_per_photo"][1], abs=1e-5)
    kinds = {row["kind"] for row in result["teacher_free"]["rows"]}
    assert kinds == {"ceiling", "floor", "init", "trained"}
    assert {row["cores"] for row in result["elasticity"]} >= set(ELASTIC_BUDGETS)
    assert len(result["goals"]) == 2 * (6 + 2 + 2 + len(dq.LEARNING)) + 1 and all("met" in goal for goal in result["goals"])
    # LookWhere trained twice with the same settings gives the same bits (its training is deterministic on any
    # thread count): the rerun's measurements equal the first run's, and the goal says so
    assert result["drift"]["lookwhere"] == {"student": "LookWhere-S from teacher", "largest_difference": 0.0,
                                            "identical": True}
    # the centre is the mean of every cached crop: the constant scores exactly 0 on the centred measures
    for block in result["results"].values():
        for m in ("cls_centred", "patch_centred", "patch_r2"):
            assert block["baselines"]["constant"][m]["per_photo"] == [0.0] * 4
    # the learning table: each entry is the paired difference it names, recomputed here from the per-photo values
    rows = {(row["student"], row["setting"]): row for row in result["results"]["28"]["students"]}
    veca = rows["VECA elastic", "cores=32"]["patch_centred"]["per_seed_per_photo"]
    assert result["learning"]["veca_centred_patch"]["mean"] == pytest.approx(qs.grand_mean(veca))
    after = rows["VECA from teacher", "cores=32"]["patch_centred"]["per_seed_per_photo"]
    before = result["results"]["28"]["baselines"]["init"]["VECA from teacher/cores=32"]["patch_centred"][
        "per_seed_per_photo"]
    assert result["learning"]["veca_teacher_trained_minus_untrained"]["mean"] == pytest.approx(
        qs.grand_mean([[a - b for a, b in zip(x, y)] for x, y in zip(after, before)]))
    selection = next(row for row in result["selection"] if row["resolution"] == 28 and row["metric"] ==
                     "patch_centred" and row["model"] == "LookWhere-S from teacher")
    difference = [[a - b for a, b in zip(x, y)] for x, y in zip(selection["per_seed_per_photo"]["selector"],
                                                                   selection["per_seed_per_photo"]["random"])]
    assert result["learning"]["lookwhere_selector_minus_random"]["mean"] == pytest.approx(qs.grand_mean(difference))
    assert set(result["learning"]) == set(dq.LEARNING) | {f"{key}@56" for key in dq.LEARNING}
    # validation picked a step, and that step's student is the one measured
    assert all(record["best_step"] in {v["step"] for v in record["validation"]} for record in result["training"].values())
    assert set(result["training"]) == {f"{name}/seed{s}" for name in STUDENTS for s in (0, 1)} | {
        f"{name} rerun/seed0" for name in dq.RERUN_STUDENTS}
    # VECA from the teacher's conversion: its per-block table at its start, after stage 1 and at the chosen step;
    # stage 1 moves the bank alone (the uniform reference, the copied value and output projections, is unchanged)
    # and stage 2 every weight
    conversion = result["training"]["VECA from teacher/seed0"]["conversion"]
    assert conversion["stage1"]["steps"] == 2 and set(conversion) == {"start", "stage1", "chosen"}
    tables = {stage: conversion[stage]["transfer_error"] for stage in ("start", "stage1", "chosen")}
    assert tables["stage1"]["uniform"] == tables["start"]["uniform"] != tables["chosen"]["uniform"]
    assert tables["stage1"]["student_c8"] != tables["start"]["student_c8"]
    assert tables["stage1"]["pooled_bound_c32"] == tables["start"]["pooled_bound_c32"]

    # Interrupted after every student finished: --resume keeps them all and gives the same tables; a resume with
    # another setting (or other code) is refused in one line and leaves the run as it was.
    argv = ["--smoke", "--teacher", str(tmp_path / "teacher"), "--scratch-dir", str(tmp_path / "scratch"),
            "--heldout-photos", str(held_out), "--out", str(tmp_path / "again.json"), "--plot", str(plot), "--resume"]
    interrupted = tmp_path / "scratch" / "seed1" / dq.slug("LookWhere-S from teacher")
    (interrupted / "quality_record.pt").unlink()  # as if stopped while it trained: it trains again, the same way
    again = dq.main(argv)
    assert sorted(again["resumed_students"]) == sorted(set(result["training"]) - {"LookWhere-S from teacher/seed1"})
    assert again["results"] == result["results"]
    assert again["training"]["LookWhere-S from teacher/seed1"]["data_checksum"] == result["training"][
        "LookWhere-S from teacher/seed1"]["data_checksum"]
    with pytest.raises(SystemExit) as stop:
        dq.main([*argv, "--weight-decay", "0.5"])
    assert "holds no interrupted run of these settings and this code" in str(stop.value) and "\n" not in str(stop.value)
    assert sorted(p.name for p in (tmp_path / "scratch" / "seed0").iterdir()) == sorted(
        [dq.slug(name) for name in STUDENTS] + ["teacher_cache"])


def test_each_selection_runs_the_models_own_extractor_and_fill(tmp_path):
    """The selector's choice through `chosen_features` is the model's own forward; the centre choice keeps the cells
    nearest the centre; the oracle keeps the teacher map's top-k."""
    teacher(tmp_path)
    model, _ = load_teacher_model(str(tmp_path / "teacher"))
    args = dq.parse_args(["--smoke"])
    student = new_student("LookWhere-S from teacher", model, args, 0)[0].eval()
    torch.manual_seed(0)
    pixels = torch.randn(3, 3, 56, 56)
    with torch.no_grad():
        own = student(pixels, k=4)
        pooled, patches = chosen_features(student, pixels, 4, lambda selector_map, photos: selector_map)
    torch.testing.assert_close(pooled, own.pooler_output)
    torch.testing.assert_close(patches, own.last_hidden_state[:, 1 + student.config.num_register_tokens :])
    assert centre_scores((4, 4)).topk(4).indices.sort().values.tolist() == [5, 6, 9, 10]
    assert centre_scores((3, 5)).topk(3).indices.sort().values.tolist() == [2, 6, 7]  # ties: row-major
    assert centre_scores((3, 3)).topk(5).indices.sort().values.tolist() == [1, 3, 4, 5, 7]
    # another choice changes what the extractor sees: the centre's features differ from the selector's
    with torch.no_grad():
        centred = chosen_features(student, pixels, 4, lambda m, photos: centre_scores((4, 4)).expand(3, -1).to(m))
    assert not torch.allclose(centred[1], patches)


@pytest.mark.parametrize("map_queries", ["patches", "cls"])
def test_lookwhere_students_train_every_map_cell_on_the_chosen_map_target(map_queries):
    """Both LookWhere students resize their map with antialiasing (lookwhere_from_teacher's, as the training script's);
    --map-queries picks the map target the cache serves and the oracle selects by."""
    model = teacher()
    args = dq.parse_args(["--smoke", "--map-queries", map_queries])
    for name in ("LookWhere-S random init", "LookWhere-S from teacher"):
        assert new_student(name, model, args, 0)[0].config.selector_map_antialias, name
    pixels = torch.randn(2, 3, 28, 28)
    _, _, served, _ = cached_targets(model, (2, 2), args.map_queries)(pixels)
    _, _, chosen = teacher_targets_and_map(model, pixels, (2, 2), map_queries)
    _, _, other = teacher_targets_and_map(model, pixels, (2, 2), {"patches": "cls", "cls": "patches"}[map_queries])
    torch.testing.assert_close(served, chosen.half().float(), atol=0, rtol=0)
    assert not torch.allclose(served, other.half().float())


def test_a_missing_teacher_is_one_line(tmp_path):
    with pytest.raises(SystemExit) as stop:
        dq.main(["--smoke", "--teacher", str(tmp_path / "nowhere"), "--scratch-dir", str(tmp_path / "scratch")])
    assert str(stop.value).startswith("error: --teacher") and "\n" not in str(stop.value)


def test_a_held_out_photo_among_the_training_photos_is_one_line(tmp_path):
    teacher(tmp_path)
    photos = tmp_path / "photos"
    photos.mkdir()
    shutil.copy(sorted(HELDOUT_PHOTOS.glob("*.jpg"))[0], photos / "holiday.jpg")
    with pytest.raises(SystemExit) as stop:
        dq.main(["--smoke", "--teacher", str(tmp_path / "teacher"), "--scratch-dir", str(tmp_path / "scratch"),
                 "--train-photos", str(photos)])
    message = str(stop.value)
    assert message.startswith("error: Image folder") and "held-out photos" in message and "\n" not in message
    assert not (tmp_path / "scratch" / "train_photos").exists() or not any((tmp_path / "scratch" / "train_photos").iterdir())


def test_scratch_folder_is_refused_unless_the_benchmark_made_it(tmp_path):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="was not made by this benchmark"):
        dq.scratch_folder(foreign)
    assert (foreign / "notes.txt").read_text() == "keep me"
    ours = dq.scratch_folder(tmp_path / "ours")
    (ours / "old").mkdir()
    assert not (dq.scratch_folder(ours) / "old").exists()  # every run starts from scratch


@pytest.mark.parametrize("argv, words", [
    (["--resolutions", "230"], "not a positive multiple of the patch size 14; use e.g. 224"),
    (["--resolutions", "224"], "must include the training size --image-size 112"),
    (["--k-max", "300"], "--k-max <= 64"),
    (["--seeds", "1", "1"], "repeats a seed"),
    (["--rerun-seed", "5"], "is not one of --seeds"),
    (["--map-queries", "registers"], "argument --map-queries: invalid choice: 'registers'"),
    (["--stage1-steps", "-1"], "--stage1-steps -1 must be at least 0"),
])
def test_bad_arguments_are_one_line(argv, words, capsys):
    with pytest.raises(SystemExit) as stop:
        dq.parse_args(argv)
    assert stop.value.code == 2
    assert words in capsys.readouterr().err


def test_the_lookwhere_rerun_check_sees_any_difference():
    first = {"cores=1": {"agreement": {28: {"cls": [0.5, 0.25]}}, "gflops": {28: 1.0}}}
    second = {"cores=1": {"agreement": {28: {"cls": [0.5, 0.25 + 2**-20]}}, "gflops": {28: 1.0}}}
    name = dq.RERUN_STUDENTS[1]
    assert dq.lookwhere_rerun({(name, 0): first, (f"{name} rerun", 0): first}, 0)["identical"]
    changed = dq.lookwhere_rerun({(name, 0): first, (f"{name} rerun", 0): second}, 0)
    assert changed["largest_difference"] == 2**-20 and not changed["identical"]


class RunsCode:
    """A pickle that, loaded with the full unpickler, writes the file `marker`."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


def test_resume_reads_a_record_without_running_its_code(tmp_path):
    """A finished student's record comes back as written (its resolutions stay int keys); one that would run code
    when unpickled is one line saying to rerun without --resume, and runs nothing."""
    record = {"record": {"lr": 1e-3, "validation": [{"step": 5, "score": 0.5}]},
              "measured": {"cores=1": {"gflops": {28: 1.0}, "agreement": {28: {"cls": [0.5, 0.25]}}}}, "untrained": {}}
    torch.save(record, tmp_path / "quality_record.pt")
    assert dq.read_record(tmp_path / "quality_record.pt") == record
    marker = tmp_path / "ran.txt"
    torch.save({"record": RunsCode(str(marker))}, tmp_path / "old.pt")
    with pytest.raises(SystemExit) as stop:
        dq.read_record(tmp_path / "old.pt")
    assert str(stop.value).startswith("error: --resume: ") and "rerun without --resume" in str(stop.value)
    assert "\n" not in str(stop.value) and not marker.exists()
