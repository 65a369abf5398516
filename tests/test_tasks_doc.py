"""docs/tasks.md states the committed sparse-recognition result: its opening table and each goal's verdict are the
JSON's (benchmarks/results/sparse_recognition.json), and so are the pilot's choice and the canvases used."""

import json
import re
from pathlib import Path

from benchmarks import sparse_recognition as sr

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "tasks.md").read_text()
REPORT = json.loads((ROOT / "benchmarks" / "results" / "sparse_recognition.json").read_text())
PILOT = json.loads((ROOT / "benchmarks" / "results" / "task_pilot.json").read_text())


def test_the_page_opens_with_the_committed_results_table():
    first_table = PAGE[PAGE.index("\n|") + 1 :]
    assert first_table.startswith(sr.results_table(REPORT))


def test_each_goal_is_stated_as_the_json_decides_it():
    for goal in REPORT["goals"]:
        verdict = "met" if goal["met"] else "missed"
        # a goal's bullet: from its name to its verdict in bold, never across the next bullet
        stated = re.findall(rf"`{goal['goal']}`(?:(?!\n- ).)*?\*\*(met|missed)\*\*", PAGE, flags=re.DOTALL)
        assert stated and set(stated) == {verdict}, goal["goal"]


def test_the_run_used_the_canvases_the_committed_pilot_chose():
    chosen = PILOT["choice"]["chosen"]
    assert chosen == {"strokes": REPORT["task"]["strokes"], "digit_size": REPORT["task"]["digit_size"]}
    assert REPORT["pilot"]["choice"] == PILOT["choice"]
    assert REPORT["task"]["train"] >= 400 and REPORT["task"]["test"] >= 200
