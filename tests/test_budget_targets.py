"""A target instead of a budget: `max_gflops=` picks the largest budget whose analytic cost at the call's image size
fits (VECA among `config.training_budgets`, LookWhere among k = 1..Hp * Wp); `budget_for_latency` the largest
calibrated budget whose latency in `config.latency_table` fits, outside the model. Timing tables here are fakes: no
assertion depends on this machine."""

import json
import warnings

import pytest
import torch
from conftest import tiny_lookwhere_config, tiny_veca_config
from PIL import Image
from transformers import AutoModel, pipeline

from corevision_hf import (
    LookWhereConfig,
    LookWhereModel,
    VecaConfig,
    VecaModel,
    budget_for_latency,
    calibrate_latency,
    lookwhere_flops,
    save_model_folder,
    veca_flops,
)
from corevision_hf import calibrate
from corevision_hf.calibrate import measurement_setup

SIZES = [(32, 48), (64, 64)]


@pytest.fixture(scope="module")
def veca() -> VecaModel:
    torch.manual_seed(0)
    config = tiny_veca_config(num_cores=8, training_budgets=[1, 2, 4, 6, 8], training_budget_weights=[1] * 5)
    return VecaModel(config).eval()


@pytest.fixture(scope="module")
def lookwhere() -> LookWhereModel:
    torch.manual_seed(0)
    return LookWhereModel(tiny_lookwhere_config()).eval()


def gflops(model, height, width, budget) -> float:
    if model.config.model_type == "veca":
        return veca_flops(model.config, height, width, num_cores=budget) / 1e9
    return lookwhere_flops(model.config, height, width, k=budget) / 1e9


def chosen_budget(model, pixel_values, **call) -> int:
    """The budget a call ran with, read from its output's shapes."""
    with torch.no_grad():
        output = model(pixel_values, **call)
    if model.config.model_type == "veca":
        return output.core_coordinates.shape[1], output
    return output.selected_indices.shape[1], output


def budgets(model, height, width) -> list[int]:
    if model.config.model_type == "veca":
        return sorted(model.config.training_budgets)
    return list(range(1, (height // model.config.patch_size) * (width // model.config.patch_size) + 1))


@pytest.mark.parametrize("height, width", SIZES)
@pytest.mark.parametrize("name", ["veca", "lookwhere"])
def test_max_gflops_runs_the_largest_budget_that_fits(name, height, width, request):
    model = request.getfixturevalue(name)
    pixel_values = torch.randn(2, 3, height, width, generator=torch.Generator().manual_seed(0))
    candidates = budgets(model, height, width)
    # between two budgets' costs, on one exactly, and above the largest
    picks = [0, len(candidates) // 2, len(candidates) - 2]
    targets = [(gflops(model, height, width, candidates[i]) + gflops(model, height, width, candidates[i + 1])) / 2
               for i in picks]
    targets += [gflops(model, height, width, candidates[picks[1]]), 2 * gflops(model, height, width, candidates[-1])]
    for target in targets:
        budget, output = chosen_budget(model, pixel_values, max_gflops=target)
        assert gflops(model, height, width, budget) <= target
        if budget != candidates[-1]:
            assert gflops(model, height, width, candidates[candidates.index(budget) + 1]) > target
        direct = {"num_cores" if name == "veca" else "k": budget}
        _, expected = chosen_budget(model, pixel_values, **direct)
        torch.testing.assert_close(output.last_hidden_state, expected.last_hidden_state, atol=0, rtol=0)
    assert chosen_budget(model, pixel_values, max_gflops=targets[-1])[0] == candidates[-1]


@pytest.mark.parametrize("name, cheapest", [("veca", "num_cores=1"), ("lookwhere", "k=1")])
def test_an_impossible_target_names_the_cheapest_budget_and_its_cost(name, cheapest, request):
    model = request.getfixturevalue(name)
    cost = gflops(model, 32, 48, 1)
    message = rf"max_gflops=0.0001 is below .* 32x48 px: {cheapest} costs {cost:.4g} GFLOPs"
    with pytest.raises(ValueError, match=message):
        model(torch.randn(1, 3, 32, 48), max_gflops=1e-4)


@pytest.mark.parametrize(
    "name, call, message",
    [
        ("veca", dict(num_cores=2, max_gflops=1.0), "num_cores=2 and max_gflops=1.0 each choose the budget"),
        ("lookwhere", dict(k=3, max_gflops=1.0), "k=3 and max_gflops=1.0 each choose the budget"),
        ("veca", dict(max_gflops=-1.0), "max_gflops must be a finite number > 0"),
        ("lookwhere", dict(max_gflops=float("nan")), "max_gflops must be a finite number > 0"),
    ],
)
def test_bad_targets_are_one_clear_error_each(name, call, message, request):
    with pytest.raises(ValueError, match=message):
        request.getfixturevalue(name)(torch.randn(1, 3, 32, 32), **call)


@pytest.mark.parametrize("name", ["veca", "lookwhere"])
def test_a_latency_target_is_chosen_outside_the_model(name, request):
    """Forward reads nothing of the machine: max_ms is refused, naming what to call; that refuses a bad target and a
    model without a table."""
    model = request.getfixturevalue(name)
    with pytest.raises(ValueError, match=r"takes no max_ms: .*corevision_hf.budget_for_latency\(model, pixel_values"):
        model(torch.randn(1, 3, 32, 32), max_ms=5.0)
    for target, message in [(float("nan"), "max_ms must be a finite number > 0"),
                            (5.0, r"run corevision_hf.calibrate_latency\(model, sizes=\[...\]\) once")]:
        with pytest.raises(ValueError, match=message):
            budget_for_latency(model, torch.randn(1, 3, 32, 32), target)


def measured_here(sizes: list, **setup) -> dict:
    """A VECA table of `sizes` rows measured in this test's setup (CPU, float32, batch 1, this machine and threads),
    with `setup`'s fields changed."""
    return {**measurement_setup("cpu", torch.float32, 1), "budget": "num_cores", **setup, "sizes": sizes}


def fake_table(budgets: list, **setup) -> dict:
    """32x32 px: 10, 20, 40 ms for the three budgets; 64x64 px: three times that."""
    return measured_here([
        {"height": 32, "width": 32, "ms": [[budgets[0], 10.0], [budgets[1], 20.0], [budgets[2], 40.0]]},
        {"height": 64, "width": 64, "ms": [[budgets[0], 30.0], [budgets[1], 60.0], [budgets[2], 120.0]]},
    ], **{"budget": "num_cores" if isinstance(budgets[0], int) else "k_ratio", **setup})


def latency_budget(model, pixel_values, max_ms: float) -> int:
    """The budget a call with `budget_for_latency`'s keyword ran with."""
    return chosen_budget(model, pixel_values, **budget_for_latency(model, pixel_values, max_ms))[0]


def test_max_ms_picks_what_the_table_says(veca, lookwhere, monkeypatch):
    monkeypatch.setattr(veca.config, "latency_table", fake_table([2, 4, 8]), raising=False)
    pick = lambda model, size, ms: latency_budget(model, torch.randn(1, 3, *size), ms)  # noqa: E731
    assert [pick(veca, (32, 32), ms) for ms in (10, 25, 40, 1000)] == [2, 4, 8, 8]
    # 48x48 px lies 5/12 of the way from 32x32 to 64x64 in pixels: 4 cores take 20 + 5/12 * 40 = 36.7 ms there
    assert [pick(veca, (48, 48), ms) for ms in (36.6, 36.7)] == [2, 4]
    with pytest.raises(ValueError, match="max_ms=5 is below the cheapest budget at 32x32 px: num_cores=2 costs 10 ms"):
        pick(veca, (32, 32), 5)
    with pytest.raises(ValueError, match=r"covers 32x32, 64x64 px only.*sizes=\[\(72, 72\), ...\]"):
        pick(veca, (72, 72), 100)
    for field, value in [("device", "cuda"), ("machine", "another CPU"), ("threads", 999), ("dtype", "bfloat16"),
                         ("batch_size", 8)]:
        off_the_cpu = {"threads": None} if field == "device" else {}  # a GPU table counts no threads
        monkeypatch.setattr(veca.config, "latency_table", fake_table([2, 4, 8], **{field: value}, **off_the_cpu),
                            raising=False)
        with pytest.raises(ValueError, match=rf"measured in another setup \({field} {value!r}, this call"):
            pick(veca, (32, 32), 100)
    # LookWhere's calibrated budgets are k_ratios: k = k_ratio * Hp * Wp (64 patches at 32x32 px)
    monkeypatch.setattr(lookwhere.config, "latency_table", fake_table([0.25, 0.5, 1.0]), raising=False)
    assert [pick(lookwhere, (32, 32), ms) for ms in (15, 25, 50)] == [16, 32, 64]
    assert budget_for_latency(lookwhere, (32, 32), 25) == {"k_ratio": 0.5}  # a size: one image, the model's dtype


def test_a_table_whose_sizes_share_no_budget_is_a_clear_error(veca, monkeypatch):
    table = measured_here([{"height": 32, "width": 32, "ms": [[2, 10.0]]},
                           {"height": 64, "width": 64, "ms": [[4, 30.0]]}])
    monkeypatch.setattr(veca.config, "latency_table", table, raising=False)
    with pytest.raises(ValueError, match="share no budget"):
        budget_for_latency(veca, torch.randn(1, 3, 48, 48), 100)


def test_a_larger_budget_never_counts_as_faster(veca, monkeypatch):
    table = measured_here([{"height": 32, "width": 32, "ms": [[2, 10.0], [4, 30.0], [8, 25.0]]}])
    monkeypatch.setattr(veca.config, "latency_table", table, raising=False)
    assert latency_budget(veca, torch.randn(1, 3, 32, 32), 27) == 2  # 8 cores measured 25 ms: noise


def test_calibration_round_trip_through_the_folder(tmp_path):
    torch.manual_seed(0)
    VecaModel(tiny_veca_config()).save_pretrained(tmp_path / "veca")
    model = AutoModel.from_pretrained(tmp_path / "veca").eval()
    table = calibrate_latency(model, sizes=[32, (32, 48)], budgets=[2, 8], runs=1)
    assert [(row["height"], row["width"], [b for b, _ in row["ms"]]) for row in table["sizes"]] == [
        (32, 32, [2, 8]), (32, 48, [2, 8])]
    assert model.config.latency_table == table  # budget_for_latency works in this session
    assert json.loads((tmp_path / "veca" / "config.json").read_text())["latency_table"] == table
    assert AutoModel.from_pretrained(tmp_path / "veca").config.latency_table == table

    # what a fresh load picks for a latency is what its table says (a fake one, so that timing noise cannot matter)
    fake = fake_table([2, 4, 8])
    model.config.latency_table = fake
    model.save_pretrained(tmp_path / "saved")
    reloaded = AutoModel.from_pretrained(tmp_path / "saved").eval()
    assert latency_budget(reloaded, torch.randn(1, 3, 32, 32), 25) == 4


@pytest.mark.parametrize("times, warned", [
    ([1.0, 2.0, 3.0, 4.0], []),
    ([2.0, 1.0, 3.0, 4.0], ["num_cores=8 came out faster than num_cores=2 at 32x32 px (1 ms < 2 ms)"]),
    ([1.0, 4.0, 3.0, 2.0], ["num_cores=8 came out faster than num_cores=2 at 32x48 px (2 ms < 3 ms)",
                            "32x48 px came out faster than 32x32 px at num_cores=8 (2 ms < 4 ms)"]),
])
def test_a_table_that_is_not_monotone_is_stored_with_a_warning(tmp_path, monkeypatch, times, warned):
    """Fake timings (no assertion depends on this machine): a larger budget or size that came out faster is named in
    a warning, as evaluate_budgets names it; the table is stored as measured."""
    torch.manual_seed(0)
    VecaModel(tiny_veca_config()).save_pretrained(tmp_path / "veca")
    model = AutoModel.from_pretrained(tmp_path / "veca").eval()
    measured = iter(times)
    monkeypatch.setattr(calibrate, "median_latency_ms", lambda *args, **kwargs: next(measured))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = calibrate_latency(model, sizes=[32, (32, 48)], budgets=[2, 8], runs=1)
    messages = [str(w.message) for w in caught if "calibrate_latency" in str(w.message)]
    assert len(messages) == (1 if warned else 0)
    for words in warned:
        assert words in messages[0], messages[0]
    assert [ms for row in table["sizes"] for _, ms in row["ms"]] == times
    assert json.loads((tmp_path / "veca" / "config.json").read_text())["latency_table"] == table


def test_calibrate_latency_saves_to_an_explicit_folder_only_beside_a_config(lookwhere, tmp_path, monkeypatch):
    monkeypatch.setattr(lookwhere.config, "latency_table", None, raising=False)
    with pytest.raises(ValueError, match="holds no config.json: save the model there first"):
        calibrate_latency(lookwhere, sizes=[32], save_to=tmp_path)
    lookwhere.save_pretrained(tmp_path)
    table = calibrate_latency(lookwhere, sizes=[32], budgets=[0.5, 1.0], runs=1, save_to=tmp_path)
    assert table["budget"] == "k_ratio" and table["device"] == "cpu"
    assert LookWhereConfig.from_pretrained(tmp_path).latency_table == table


def test_the_config_default_target(tmp_path):
    torch.manual_seed(0)
    config = tiny_veca_config()
    target = (veca_flops(config, 32, 32, num_cores=5) + veca_flops(config, 32, 32, num_cores=6)) / 2e9
    VecaModel(config).save_pretrained(tmp_path / "veca")
    model = AutoModel.from_pretrained(tmp_path / "veca", default_max_gflops=target).eval()
    assert chosen_budget(model, torch.randn(1, 3, 32, 32))[0] == 5
    assert chosen_budget(model, torch.randn(1, 3, 32, 32), num_cores=8)[0] == 8  # a call's budget wins
    target = lookwhere_flops(tiny_lookwhere_config(), 32, 32, k=7) / 1e9
    lookwhere = LookWhereModel(tiny_lookwhere_config(default_max_gflops=target))
    assert chosen_budget(lookwhere.eval(), torch.randn(1, 3, 32, 32))[0] == 7  # wins over k_ratio


@pytest.mark.parametrize(
    "config, fields, message",
    [
        (VecaConfig, dict(default_max_gflops=0), "default_max_gflops must be a finite number > 0"),
        (VecaConfig, dict(default_max_gflops=1.0, default_num_cores=4),
         "default_num_cores=4 and default_max_gflops=1.0"),
        (LookWhereConfig, dict(default_max_gflops=1.0, default_k=4), "default_k=4 and default_max_gflops=1.0"),
    ],
)
def test_bad_target_defaults_fail_at_load(config, fields, message):
    with pytest.raises(ValueError, match=message):
        config(**fields)


def test_pipelines_pass_targets_through(tmp_path):
    torch.manual_seed(0)
    save_model_folder(VecaModel(tiny_veca_config()), tmp_path / "veca")
    save_model_folder(LookWhereModel(tiny_lookwhere_config()), tmp_path / "lookwhere")
    photo = Image.new("RGB", (32, 32), (120, 80, 40))
    pipe = pipeline("image-feature-extraction", model=str(tmp_path / "veca"), trust_remote_code=True)
    target = veca_flops(pipe.model.config, 32, 32, num_cores=3) / 1e9
    assert pipe(photo, max_gflops=target, return_tensors=True).shape[1] == 3 + 16
    with pytest.raises(ValueError, match="below the cheapest budget"):
        pipe(photo, max_gflops=1e-6)
    pipe = pipeline("image-feature-extraction", model=str(tmp_path / "lookwhere"), trust_remote_code=True)
    pipe.model.config.latency_table = fake_table([0.25, 0.5, 1.0])
    size = pipe.image_processor(photo, return_tensors="pt").pixel_values.shape[-2:]
    features = pipe(photo, **budget_for_latency(pipe.model, size, 25.0), fill_dense=False, return_tensors=True)
    assert features.shape[1] == 1 + 4 + 32  # CLS, 4 registers, k = 0.5 of the 8 x 8 grid
    with pytest.raises(ValueError, match=r"\['max_ms'\].*corevision_hf.budget_for_latency\(pipe.model"):
        pipe(photo, max_ms=25.0)
