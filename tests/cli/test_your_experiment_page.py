"""docs/your-experiment.md, run as a reader runs it: its files written into a project folder,
its commands run there one after another, in the page's order.

A ``python``/``yaml`` block whose first line is ``# file: <path>`` is written to that path (the
rest of the block: a preset's ``# @package`` line must come first); each
line of a ``bash`` block is a command. A command whose comment starts with ``# error:`` must fail
with exactly one line that starts as the comment says, and write no ``summary.json``. The
ResNet-18 commands read CIFAR-10: here our offline JPEG copy stands in for torchvision's download
(the only change to a command), and without it they are skipped.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pandas as pd
import pytest
from support.grab_run import ARCHIVE, REPO_ROOT, cli_env

PAGE = REPO_ROOT / "docs" / "your-experiment.md"
BLOCK = re.compile(r"```(python|yaml|bash)\n(.*?)```", re.S)


#: the section that starts from nothing of the earlier ones (run alone, in a folder of its own)
ALONE = "4. Your arrays from files"


def page_steps(section: str = "", but: str = "") -> list[tuple[str, str]]:
    """``("file", path + text)`` and ``("run", command)`` steps, in the page's order (of the
    section whose ``## `` heading starts with ``section``, if given; without the one that starts
    with ``but``)."""
    text = PAGE.read_text()
    if section:
        text = text.split(f"\n## {section}", 1)[1].split("\n## ", 1)[0]
    if but:
        before, after = text.split(f"\n## {but}", 1)
        text = before + "\n## " + after.split("\n## ", 1)[1]
    steps = []
    for kind, body in BLOCK.findall(text):
        first, _, text = body.partition("\n")
        if kind in ("python", "yaml") and first.startswith("# file: "):
            steps.append(("file", first.removeprefix("# file: ") + "\n" + text))
        elif kind == "bash":
            steps += [("run", line) for line in body.splitlines() if line.strip()]
    return steps


def _command(line: str) -> tuple[list[str], str | None]:
    """The command's words (``python`` as this interpreter) and its expected error, if any."""
    command, _, comment = line.partition("  # ")
    words = shlex.split(command)
    if words[0] == "python":
        words[0] = sys.executable
    expected = (
        comment.removeprefix("error: ").split(" ...")[0] if comment.startswith("error:") else None
    )
    return words, expected


def test_the_page_has_the_files_and_commands_of_every_part():
    steps = page_steps()
    files = [body.split("\n", 1)[0] for kind, body in steps if kind == "file"]
    assert {"tiny_model.py", "my_data.py", "jsonl_logger.py", "my_conf/model/tiny.yaml"} <= set(
        files
    )
    runs = [line for kind, line in steps if kind == "run"]
    assert sum("grab_exp.report" in line for line in runs) == 5
    multiruns = [line for line in runs if re.search(r"-m grab_exp .*-m ", line)]
    assert len(multiruns) == 5  # five GraB vs RR multiruns


@pytest.mark.slow
def test_every_command_of_the_page_runs(tmp_path):
    """The page in order, but for section 4, which the next test runs on its own."""
    skipped = _run_steps(page_steps(but=ALONE), tmp_path)
    _check_outputs(tmp_path, lm=True, resnet=not skipped)


@pytest.mark.slow
def test_the_table_and_sequence_examples_run_alone(tmp_path):
    """Section 4 on its own (a reader who starts there): GraB and RR over 2 seeds, reported."""
    assert _run_steps(page_steps(ALONE), tmp_path) == []
    _check_array_outputs(tmp_path)


def test_the_page_without_section_4_keeps_every_other_step():
    every, alone, rest = page_steps(), page_steps(ALONE), page_steps(but=ALONE)
    assert alone and len(rest) == len(every) - len(alone)
    assert [s for s in every if s not in alone] == rest


def _check_array_outputs(root) -> None:
    """The table and the sequences: 2 orderings x 2 seeds finished, a report row per ordering."""
    for name, variants, log in (
        ("table", {"pair", "rr"}, "model MLP ("),
        ("sequences", {"mean", "rr"}, "model Conv1d ("),
    ):
        table = pd.read_csv(root / "report" / name / "table1.csv")
        summaries = sorted((root / "outputs" / name).rglob("summary.json"))
        found = {
            (json.loads(p.read_text())["variant"], json.loads(p.read_text())["seed"])
            for p in summaries
        }
        assert found == {(v, s) for v in variants for s in (0, 1)}, summaries
        assert {json.loads(p.read_text())["status"] for p in summaries} == {"finished"}
        assert len(table) == 2, table
        assert log in (summaries[0].parent / "__main__.log").read_text()


def _run_steps(steps: list[tuple[str, str]], tmp_path) -> list[str]:
    """Write the files and run the commands of ``steps`` in ``tmp_path``; the skipped commands."""
    env = cli_env(OMP_NUM_THREADS="1")
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # no data cached from elsewhere
    skipped = []
    for kind, step in steps:
        if kind == "file":
            path, text = step.split("\n", 1)
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / path).write_text(text)
            continue
        words, expected = _command(step)
        if "model=resnet18_gn" in step or "outputs/resnet" in step:
            if not ARCHIVE.is_file():
                skipped.append(step)
                continue
            if "model=resnet18_gn" in step:
                words += ["dataset=cifar10_jpeg", f"dataset.archive={ARCHIVE}"]
        done = subprocess.run(
            [*words, "progress=none"] if "grab_exp" in step and "report" not in step else words,
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        if expected is None:
            assert done.returncode == 0, f"{step}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
            continue
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1, done.stderr
        assert lines[0].startswith(f"error: {expected}"), lines[0]
    return skipped


def _check_outputs(root, lm: bool, resnet: bool) -> None:
    """Each multirun gave GraB and RR runs, and its report a row for each."""
    reports = ["corners", *(["lm"] if lm else []), *(["resnet"] if resnet else [])]
    for name in reports:
        table = pd.read_csv(root / "report" / name / "table1.csv")
        assert len(table) == 2, table
        summaries = sorted((root / "outputs" / name).rglob("summary.json"))
        statuses = {json.loads(p.read_text())["status"] for p in summaries}
        assert statuses == {"finished"}, summaries
    corners = sorted((root / "outputs" / "corners").rglob("summary.json"))
    assert len(corners) == 4 + 1  # mean, rr x seeds 0, 1; and the logger's run (seed 2)
    assert "model Tiny (" in (corners[0].parent / "__main__.log").read_text()
    lm_rows = pd.read_csv(next((root / "outputs" / "lm").rglob("metrics.csv")))
    assert {"train/ppl", "test/ppl"} <= set(lm_rows.columns)
    lm_table = pd.read_csv(root / "report" / "lm" / "table1.csv")
    assert lm_table["test_ppl_final_mean"].gt(1).all()  # a perplexity column, in the report too
    assert "Test perplexity (final" in (root / "report" / "lm" / "table1.md").read_text()
    corners_table = pd.read_csv(root / "report" / "corners" / "table1.csv")
    assert "test_ppl_final_mean" not in corners_table.columns  # classification: no such column
    logged = (root / "outputs" / "corners").rglob("epochs.jsonl")
    lines = [json.loads(line) for path in logged for line in path.read_text().splitlines()]
    assert [row["epoch"] for row in lines] == [1, 2]
    assert os.path.isdir(root / "my_conf")
