"""The pipeline format document's own definitions run exactly as written.

tests/data/ml-training-pipeline.json and tests/data/par-tasks.json are the document's two examples,
byte for byte (the text inside its ``pipeline(definition='...')`` and ``par(tasks='...')``). They run
to completion with a scripted agent (tests/document_agent.py: the prompt on stdin, files under
/shared and /output) and a stand-in apptainer that really binds folders in a private mount
namespace (tests/mount_sandbox.py), on a "host" that has the document's /data/sentiment-dataset,
/data and /output (bound there in a mount namespace of the test's own; the machine's / is left
alone). Where private mounts are impossible (not root), those tests skip with one line.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Dict, List

import jsonschema
import pytest

import mount_sandbox
from common.errors import UsageError
from common.pipeline.definition import parse_definition
from common.pipeline.schema import SCHEMA
from helpers import REPO, assert_usage_error, pipeline_command, read_summary, run, snapshot

DATA = REPO / "tests" / "data"
ML = DATA / "ml-training-pipeline.json"
PAR = DATA / "par-tasks.json"
#: the document's bytes: these files must not be "fixed" to make a test pass
DOCUMENT_SHA256 = {ML: "65cd642f1cecacd1e981f539600584144613245fdfeff3f2a09bd28bd43fef05",
                   PAR: "a17a9a3e8a5fb0cae3574d54f82f60cf636b51531391848cd996f72568489864"}
SANDBOX = REPO / "tests" / "mount_sandbox.py"
AGENT = f"{sys.executable} {REPO / 'tests' / 'document_agent.py'}"
RUN_ID = "ml-training-pipeline"


pytestmark = pytest.mark.usefixtures("private_node_slots")


@pytest.fixture
def image(tmp_path) -> Path:
    """An image file (the stand-in apptainer needs it to exist, as apptainer does)."""
    path = tmp_path / "pytorch.sif"
    path.write_bytes(b"a stand-in for a SIF image")
    return path


class Sandbox:
    """Runs the pipeline CLI on a host that has the document's folders, with the stand-in apptainer."""

    def __init__(self, tmp_path: Path, image: Path):
        self.tmp_path, self.image = tmp_path, image
        self.log = tmp_path / "apptainer.jsonl"

    def run(self, definition: Path, binds: Dict[str, Path], *extra: str, agent: str = AGENT):
        report = self.tmp_path / "host-report.json"
        host = [str(SANDBOX), "host", "--report", str(report)]
        for inside, folder in binds.items():
            host += ["--bind", f"{folder}:{inside}"]
        proc = run(host + ["--", sys.executable] + pipeline_command(definition, self.tmp_path / "results", "--container",
                                                               str(self.image), "--agent", agent, *extra),
                   timeout=300)
        proc.new_top_level = json.loads(report.read_text())["new_top_level"] if report.exists() else None
        return proc

    def calls(self) -> List[dict]:
        """What the stand-in apptainer was asked, one entry per step run."""
        return [json.loads(line) for line in self.log.read_text().splitlines()]


@pytest.fixture
def sandbox(tmp_path, image, monkeypatch) -> Sandbox:
    why = mount_sandbox.unavailable()
    if why:
        pytest.skip(f"no private bind mounts here: {why}")
    wrapper = tmp_path / "bin" / "apptainer"
    wrapper.parent.mkdir()
    wrapper.write_text(f"#!/bin/sh\nexec '{sys.executable}' '{SANDBOX}' apptainer \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("PIPELINE_APPTAINER", str(wrapper))
    # The image's software: this Python and the agent, bound as a site's apptainer.conf binds its
    # software folders (the image's own /usr, /etc ... are the machine's, see mount_sandbox).
    folders = sorted({str(REPO), sys.prefix, sys.base_prefix, str(Path(os.path.realpath(sys.executable)).parents[1])})
    kept = [f for f in folders if not any(f != other and f.startswith(other.rstrip("/") + "/") for other in folders)]
    monkeypatch.setenv("APPTAINER_BINDPATH", ",".join(kept))
    monkeypatch.setenv(mount_sandbox.LOG_ENV, str(tmp_path / "apptainer.jsonl"))
    return Sandbox(tmp_path, image)


def dataset(tmp_path: Path) -> Path:
    """The host's /data/sentiment-dataset (bound at /data on the test's host)."""
    host_data = tmp_path / "host-data"
    (host_data / "sentiment-dataset").mkdir(parents=True)
    for name in ("train", "val", "test"):
        (host_data / "sentiment-dataset" / f"{name}.csv").write_text(f"text,label\n{name} example,1\n")
    return host_data


def statuses(results: Path, run_id: str, steps) -> Dict[str, str]:
    return {step: json.loads((results / run_id / step / "status.json").read_text())["status"] for step in steps}


def read_lines(output: Path) -> Dict[str, str]:
    """The agent's answer: ``{"/shared/x": sha256}`` of each file it read."""
    found = {}
    for line in output.read_text().splitlines():
        if line.startswith("- read "):
            _, _, path, _, digest = line.split()
            found[path] = digest
    return found


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ----- without containers: the files, the validator, the schema, --dry-run -----
def test_the_document_files_are_its_bytes():
    for path, digest in DOCUMENT_SHA256.items():
        assert sha256(path) == digest, f"{path.name} is no longer the document's text"


def test_the_schema_takes_both_files_and_tools_in_either_form():
    for path in (ML, PAR):
        jsonschema.validate(json.loads(path.read_text()), SCHEMA)
    tasks = json.loads(PAR.read_text())
    jsonschema.validate({"tasks": tasks, "container": "docker://pytorch"}, SCHEMA)
    data = json.loads(ML.read_text())
    data["steps"][0]["tools"] = ["Read", "Write"]
    jsonschema.validate(data, SCHEMA)
    for bad in ("Read,,Write", "", "Read, ", ["Read", " "]):
        data["steps"][0]["tools"] = bad
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(data, SCHEMA)
        with pytest.raises(UsageError, match="tools must be|each of tools must be"):
            parse_definition(data, "ml.json", default_image="docker://pytorch")


def test_tools_as_one_string_are_trimmed_names():
    step = {"id": "a", "prompt": "go", "tools": " Read , Write,Bash"}
    [pipeline] = parse_definition({"name": "p", "steps": [step]})
    assert pipeline.steps[0].tools == ("Read", "Write", "Bash")
    with pytest.raises(UsageError, match="tools lists 'Read' twice"):
        parse_definition({"name": "p", "steps": [dict(step, tools="Read,Write, Read")]})


def test_the_default_image_comes_from_the_step_the_pipeline_the_file_the_flag():
    def images(data, default=None):
        return [step.container for p in parse_definition(data, default_image=default) for step in p.steps]

    mount = [{"host_path": "/d", "container_path": "/d"}]
    own, bare = {"id": "own", "command": "true", "container": "docker://own"}, {"id": "bare", "command": "true", "mounts": mount}
    assert images({"name": "p", "steps": [own, bare]}, "docker://flag") == ["docker://own", "docker://flag"]
    assert images({"name": "p", "container": "docker://pipeline", "steps": [own, bare]}, "docker://flag") == [
        "docker://own", "docker://pipeline"]
    assert images({"container": "docker://file", "pipelines": [{"name": "p", "steps": [own, bare]},
                                                              {"name": "q", "container": "docker://q", "steps": [bare]}]},
                  "docker://flag") == ["docker://own", "docker://file", "docker://q"]
    assert images({"container": "docker://file", "tasks": [{"command": "true", "mounts": mount}]}) == ["docker://file"]
    assert images({"name": "p", "steps": [{"id": "plain", "command": "true"}]}) == [None]  # no image, no mounts: the host
    with pytest.raises(UsageError, match="mount container_path '/shared/data': /shared is where"):
        parse_definition({"name": "p", "steps": [dict(bare, mounts=[{"host_path": "/d", "container_path": "/shared/data"}])]},
                         default_image="docker://flag")


@pytest.mark.parametrize("definition", [ML, PAR], ids=lambda p: p.name)
def test_mounts_without_any_image_are_one_line_naming_the_three_ways(tmp_path, definition):
    results = tmp_path / "results"
    for extra in ([], ["--dry-run"]):
        proc = run(pipeline_command(definition, results, "--agent", AGENT, *extra))
        assert_usage_error(proc, "mounts need a container image and none is given", '"container"',
                           "--container IMAGE", "PIPELINE_CONTAINER")
        assert not results.exists()


def test_dry_run_plans_the_document_definitions(tmp_path, image, monkeypatch):
    apptainer = tmp_path / "apptainer"
    apptainer.write_text("#!/bin/sh\nexit 1\n")
    apptainer.chmod(0o755)
    monkeypatch.setenv("PIPELINE_APPTAINER", str(apptainer))
    results = tmp_path / "results"
    proc = run(pipeline_command(ML, results, "--agent", AGENT, "--container", str(image), "--dry-run"))
    assert proc.returncode == 0, proc.stderr
    plan = proc.stdout
    assert "pipeline ml-training-pipeline; deadline 7200 s; budget 5" in plan
    assert plan.count("tools Read,Write,Bash;") == 3 and "tools Read,Write;" in plan
    assert plan.count(f"in {image} with --nv, shared/ bound at /shared; mounts /data/sentiment-dataset at /data "
                      "(read-only)") == 3
    assert "4. report: prompt 'Read /shared/metrics.json" in plan and f"in {image}, shared/ bound at /shared" in plan
    # PIPELINE_CONTAINER is the third way; par's tasks are one-step pipelines
    monkeypatch.setenv("PIPELINE_CONTAINER", str(image))
    proc = run(pipeline_command(PAR, results, "--agent", AGENT, "--dry-run"))
    assert proc.returncode == 0, proc.stderr
    assert "Dry run: 2 pipelines" in proc.stdout and "pipeline task-1\n  1. task: prompt 'Train model A" in proc.stdout
    assert proc.stdout.count("mounts /data at /data (read-only), /output at /output") == 2
    assert not results.exists()


def test_a_dry_run_names_mount_folders_missing_on_this_node(tmp_path, image, monkeypatch):
    """apptainer refuses to start a step whose bind source is missing (exit 255): the plan says so
    before the run, for the folders that are missing only."""
    apptainer = tmp_path / "apptainer"
    apptainer.write_text("#!/bin/sh\nexit 1\n")
    apptainer.chmod(0o755)
    monkeypatch.setenv("PIPELINE_APPTAINER", str(apptainer))
    here, gone = tmp_path / "data", tmp_path / "gone"
    here.mkdir()
    definition = tmp_path / "p.json"
    definition.write_text(json.dumps({"name": "p", "container": str(image), "steps": [
        {"id": "a", "command": "true", "mounts": [{"host_path": str(here), "container_path": "/data"},
                                                 {"host_path": str(gone), "container_path": "/gone"}]}]}))
    proc = run(pipeline_command(definition, tmp_path / "results", "--dry-run"))
    assert proc.returncode == 0, proc.stderr
    assert f"Not on this node ({os.uname().nodename}): {gone}; a step that mounts one fails" in proc.stdout
    gone.mkdir()
    assert "Not on this node" not in run(pipeline_command(definition, tmp_path / "results", "--dry-run")).stdout


@pytest.mark.parametrize("separator", [":", ","])
def test_a_results_folder_apptainer_cannot_bind_is_refused_before_the_run(tmp_path, image, monkeypatch, separator):
    apptainer = tmp_path / "apptainer"
    apptainer.write_text("#!/bin/sh\nexit 1\n")
    apptainer.chmod(0o755)
    monkeypatch.setenv("PIPELINE_APPTAINER", str(apptainer))
    definition = tmp_path / "p.json"
    definition.write_text(json.dumps({"name": "p", "container": str(image), "steps": [{"id": "a", "command": "true"}]}))
    results = tmp_path / f"run{separator}1"
    assert_usage_error(run(pipeline_command(definition, results)), f"--results {results}: a step runs in a container",
                       "as separators")
    assert not results.exists()
    definition.write_text(json.dumps({"name": "p", "steps": [{"id": "a", "command": "true"}]}))  # no container: fine
    assert run(pipeline_command(definition, results)).returncode == 0


# ----- run as written: the stand-in apptainer binds for real -----
def test_the_training_pipeline_runs_as_written(sandbox, tmp_path):
    host_data = dataset(tmp_path)
    before = snapshot(host_data)
    proc = sandbox.run(ML, {"/data": host_data})
    assert proc.returncode == 0, proc.stderr
    results = tmp_path / "results"
    assert statuses(results, RUN_ID, ["train", "train-retry", "evaluate", "report"]) == {
        "train": "ok", "train-retry": "skipped", "evaluate": "ok", "report": "ok"}
    shared = results / RUN_ID / "shared"
    checkpoint = shared / "checkpoints" / "model_final.pt"
    assert json.loads(checkpoint.read_text())["written_by"] == "train"
    # train wrote /shared/checkpoints/model_final.pt: the run's shared folder, and evaluate read that file
    evaluate = read_lines(results / RUN_ID / "evaluate" / "output.md")
    assert evaluate["/shared/checkpoints/model_final.pt"] == sha256(checkpoint)
    assert evaluate["/data/test.csv"] == sha256(host_data / "sentiment-dataset" / "test.csv")
    report = read_lines(results / RUN_ID / "report" / "output.md")
    assert report == {f"/shared/{name}": sha256(shared / name)
                      for name in ("metrics.json", "training_metrics.json", "eval_report.md")}
    train_answer = (results / RUN_ID / "train" / "output.md").read_text()
    assert "tools: Read,Write,Bash." in train_answer and "Model: sonnet" in train_answer
    assert "- /data writable: no" in train_answer and "- /shared writable: yes" in train_answer  # readonly honoured
    # nothing outside the run folder: no /shared made on the host, the dataset as it was
    assert proc.new_top_level == [] and snapshot(host_data) == before
    calls = sandbox.calls()
    assert len(calls) == 3  # train, evaluate, report
    run_dir = str((results / RUN_ID).resolve())
    for call, gpu in zip(calls, (True, True, False)):
        assert call["nv"] is gpu and call["image"] == str(sandbox.image)
        assert [run_dir, run_dir, False] in call["binds"] and [f"{run_dir}/shared", "/shared", False] in call["binds"]
        assert (["/data/sentiment-dataset", "/data", True] in call["binds"]) is gpu  # report has no mounts


def test_a_failing_train_falls_back_and_a_resume_from_evaluate_reuses_shared(sandbox, tmp_path):
    host_data = dataset(tmp_path)
    results = tmp_path / "results"
    proc = sandbox.run(ML, {"/data": host_data}, agent=f"{AGENT} --fail train")
    assert proc.returncode == 0, proc.stderr  # train's failure is handled by its on_fail
    # the run is complete, and says which step failed on the way and how to run it again after a fix
    assert f"failed and its pipeline went on (on_fail): {RUN_ID}/train" in proc.stdout, proc.stdout
    assert f"the same command with --resume {RUN_ID}/train" in proc.stdout
    assert f"**1 pipeline: 1 ok; failed along the way (their pipeline went on): {RUN_ID}/train**" in (
        results / "summary.md").read_text()
    assert statuses(results, RUN_ID, ["train", "train-retry", "evaluate", "report"]) == {
        "train": "failed", "train-retry": "ok", "evaluate": "ok", "report": "ok"}
    assert "CUDA out of memory" in (results / RUN_ID / "train" / "stderr.log").read_text()
    summary = read_summary(results)["pipelines"][RUN_ID]
    assert summary["order"] == ["train", "train-retry", "evaluate", "report"]
    checkpoint = results / RUN_ID / "shared" / "checkpoints" / "model_final.pt"
    written = checkpoint.read_bytes()
    assert json.loads(written)["written_by"] == "train-retry"
    assert read_lines(results / RUN_ID / "evaluate" / "output.md")["/shared/checkpoints/model_final.pt"] == sha256(checkpoint)
    retry_status = (results / RUN_ID / "train-retry" / "status.json").read_text()

    proc = sandbox.run(ML, {"/data": host_data}, "--resume", f"{RUN_ID}/evaluate")
    assert proc.returncode == 0, proc.stderr
    summary = read_summary(results)["pipelines"][RUN_ID]
    assert summary["order"] == ["evaluate", "report"] and summary["resumed_from"] == "evaluate"
    assert checkpoint.read_bytes() == written and not list((results / RUN_ID).glob("shared.previous-*"))
    assert (results / RUN_ID / "train-retry" / "status.json").read_text() == retry_status
    evaluate = json.loads((results / RUN_ID / "evaluate" / "status.json").read_text())
    assert evaluate["status"] == "ok" and len(evaluate["history"]) == 2  # the first run's attempt and this one
    assert read_lines(results / RUN_ID / "evaluate" / "output.md")["/shared/checkpoints/model_final.pt"] == sha256(checkpoint)
    assert proc.new_top_level == []
    assert "along the way" not in (results / "summary.md").read_text() + proc.stdout  # train failed in the first run


def par_run(sandbox: Sandbox, tmp_path: Path, monkeypatch, capacity: int, seconds: float):
    """par-tasks.json on 2 workers with a gpu pool of ``capacity``; each task works ``seconds``."""
    host = tmp_path / f"host-{capacity}"
    (host / "data").mkdir(parents=True)
    (host / "output").mkdir()
    for name in ("a", "b"):
        (host / "data" / f"dataset-{name}.csv").write_text(f"x,y\n{name},1\n")
    monkeypatch.setenv("SWARM_RESOURCE_gpu", str(capacity))
    sandbox.tmp_path = tmp_path / f"run-{capacity}"
    sandbox.tmp_path.mkdir()
    proc = sandbox.run(PAR, {"/data": host / "data", "/output": host / "output"}, "--workers", "2",
                       agent=f"{AGENT} --sleep {seconds}")
    assert proc.returncode == 0, proc.stderr
    results = sandbox.tmp_path / "results"
    spans = {}
    for task in ("task-1", "task-2"):
        status = json.loads((results / task / "task" / "status.json").read_text())
        assert status["status"] == "ok" and status["output"] == f"{task}/task/output.md"
        spans[task] = (status["started"], status["ended"])
    assert proc.new_top_level == []
    return host, results, spans


def test_par_tasks_write_through_their_mounts_one_at_a_time(sandbox, tmp_path, monkeypatch):
    host, results, spans = par_run(sandbox, tmp_path, monkeypatch, capacity=1, seconds=1)
    for task, name in (("task-1", "a"), ("task-2", "b")):
        model = json.loads((host / "output" / f"model-{name}.pt").read_text())  # written at /output in the container
        assert model["pipeline"] == task
        assert model["read"] == {f"/data/dataset-{name}.csv": sha256(host / "data" / f"dataset-{name}.csv")}
        assert "- /data writable: no" in (results / task / "task" / "output.md").read_text()
    assert sorted(p.name for p in (host / "output").iterdir()) == ["model-a.pt", "model-b.pt"]
    (first, first_end), (second, second_end) = sorted(spans.values())
    assert first_end <= second, f"SWARM_RESOURCE_gpu=1, yet the tasks overlapped: {spans}"
    assert "task-1/task/output.md" in (results / "summary.md").read_text()
    # the same tasks with a pool of 2 do overlap: it is the pool that serialised them
    _, _, spans = par_run(sandbox, tmp_path, monkeypatch, capacity=2, seconds=4)
    (first, first_end), (second, second_end) = sorted(spans.values())
    assert second < first_end, f"SWARM_RESOURCE_gpu=2, yet the tasks ran one after the other: {spans}"


def test_the_docs_table_names_every_construct_of_the_document():
    text = (REPO / "docs" / "pipelines.md").read_text()
    table = text.split("## The format document, construct by construct", 1)[1]
    first_column = [line.split(" | ")[0] for line in table.splitlines() if line.startswith("| ")]
    constructs = ["pipeline(", "par(", "unwrap(ref=", "resume=", "SWARM_RESOURCE_", "SWARM_QUEUE_TIMEOUT", "budget",
                  "deadline_seconds", "gpu: true", "resources:", "mounts", "memory", "timeout", "model", "tools",
                  "condition", "next", "on_fail", "max_retries", "/shared/", "output.md"]
    for construct in constructs:
        assert any(construct in cell for cell in first_column), f"docs/pipelines.md: no row for {construct}"
    assert all(line.count(" | ") == 2 for line in table.splitlines() if line.startswith("| ")), "3 columns a row"


def test_the_guides_definitions_are_read_and_its_first_walks_as_the_shipped_example(tmp_path):
    """Each JSON block of docs/pipelines.md is a definition the runner reads; the first, a shorter
    examples/pipelines/ml.json, has its steps and moves (its train-retry lacked on_fail: report, so
    copied out it skipped the report the text promises)."""
    import re

    from common.pipeline.definition import load_definition

    blocks = re.findall(r"```json\n(.*?)```", (REPO / "docs" / "pipelines.md").read_text(), re.S)
    assert len(blocks) >= 2
    read = []
    for number, block in enumerate(blocks):
        (tmp_path / f"doc{number}.json").write_text(block)
        read.append(load_definition(tmp_path / f"doc{number}.json"))
    shipped = load_definition(REPO / "examples" / "pipelines" / "ml.json")[0]

    def moves(pipeline):
        return [(step.id, step.condition, step.next, step.on_fail) for step in pipeline.steps]

    assert moves(read[0][0]) == moves(shipped)


def test_the_slurm_generator_accepts_the_document_with_a_default_image(image):
    """``python -m common.slurm ... -- common.pipeline DOC --container IMAGE`` checks the definition
    with the image the job will give its steps; without one, the same one-line refusal as the runner."""
    slurm = ["-m", "common.slurm", "--gpus-per-node", "1", "--", "common.pipeline", str(ML)]
    refused = run(slurm)
    assert_usage_error(refused, "mounts need a container image", "--container IMAGE", "PIPELINE_CONTAINER")
    script = run([*slurm, "--container", str(image)])
    assert script.returncode == 0, script.stderr
    assert script.stdout.startswith("#!") and f"--container {image}" in script.stdout


def test_a_python_step_in_a_container_imports_the_module_beside_its_definition(sandbox, tmp_path):
    """docs/pipelines.md: a python step can import modules beside the definition file. In a
    container it could not ("No module named 'mystep'"): the step's PYTHONPATH was set only on the
    node. Now it is set in the container too, with the engine's code and the definition's and
    launch folders bound at their own paths, before the run's folder."""
    defs = tmp_path  # the definition's folder holds the results too: its bind must leave them writable
    (defs / "mystep.py").write_text("import os\n\ndef main():\n    return {'answer': 42, 'step': os.environ['PIPELINE_STEP_ID']}\n")
    definition = defs / "p.json"
    definition.write_text(json.dumps({"name": "p", "steps": [{"id": "fit", "python": "mystep:main"}]}))
    proc = sandbox.run(definition, {})
    assert proc.returncode == 0, proc.stderr
    results = tmp_path / "results"
    assert json.loads((results / "p" / "fit" / "result.json").read_text()) == {"answer": 42, "step": "fit"}
    (call,) = sandbox.calls()
    binds = [call["argv"][i + 1] for i, word in enumerate(call["argv"]) if word == "--bind"]
    run_dir = str((results / "p").resolve())
    assert f"{defs}:{defs}" in binds and f"{REPO}:{REPO}" in binds, binds
    # before the run's folder, which a folder of code may hold (launched from it): that stays writable
    assert binds.index(f"{defs}:{defs}") < binds.index(f"{run_dir}:{run_dir}"), binds
