"""Files a command reads that are damaged or of another kind (a run record, a pickled checkpoint, an ONNX input) and
numbers past what a float holds: each is one ValueError line naming the problem, never a traceback."""

import json

import pytest

from training.checkpointing import check_output_dir

RESUME = {"script": "training.distill_veca", "args": {"resume": True, "overwrite": False, "seed": 0},
          "num_processes": 1}
RUN_RECORDS = {
    "without num_processes": (json.dumps({"script": "training.distill_veca", "args": {"seed": 0}}),
                              "no num_processes of the kind a run writes"),
    "args a list": (json.dumps({"script": "training.distill_veca", "args": [], "num_processes": 1}),
                    "no args of the kind a run writes"),
    "truncated": ('{"script": "training.distill_veca", "args": {"se', "not valid JSON: "),
    "not an object": ("[1, 2]", "no script or args or num_processes"),
}


@pytest.mark.parametrize("case", RUN_RECORDS)
def test_a_damaged_run_record_is_one_line_naming_it(tmp_path, case):
    text, problem = RUN_RECORDS[case]
    (tmp_path / "run.json").write_text(text)
    with pytest.raises(ValueError, match=rf"^--resume: {tmp_path / 'run.json'} is not a run record \(.*{problem}") as e:
        check_output_dir(str(tmp_path), RESUME)
    assert "\n" not in str(e.value) and "start again with --overwrite" in str(e.value)
