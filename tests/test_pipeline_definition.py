"""Pipeline definitions: every bad definition is one clear line (exit 2 from the CLI), checked
before anything runs; the shipped examples are valid."""
from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest

from common.errors import UsageError
from common.pipeline.definition import check_pools, load_definition, parse_definition
from common.pipeline.loops import unbounded_cycle
from common.pipeline.sizes import parse_memory
from helpers import REPO, assert_usage_error, run, snapshot

EXAMPLES = REPO / "examples" / "pipelines"


def pipeline(*steps, **fields):
    return {"name": fields.pop("name", "p"), "steps": list(steps), **fields}


def step(step_id, **fields):
    return {"id": step_id, "command": fields.pop("command", "true"), **fields}


def problem(data, base: Path = Path(".")) -> str:
    with pytest.raises(UsageError) as caught:
        parse_definition(data, "def.json", base)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("def.json")
    return message


BAD = {
    "malformed step id": (pipeline(step("train data")), ["step id 'train data' is malformed"]),
    "step id escaping the run folder": (pipeline(step("../../etc")), ["step id '../../etc' is malformed"]),
    "step id with a slash": (pipeline(step("a/b")), ["malformed"]),
    "step id that names the shared folder": (pipeline(step("shared")), ["reserved"]),
    "missing step id": (pipeline({"command": "true"}), ["a step has no 'id'"]),
    "duplicate step ids": (pipeline(step("a"), step("a")), ["duplicate step id 'a'"]),
    "on_fail naming a missing step": (pipeline(step("train", on_fail="trian-retry"), step("train-retry")),
                                      ["on_fail names a missing step 'trian-retry'", "did you mean 'train-retry'"]),
    "next naming a missing step": (pipeline(step("a", next="zzz")), ["next names a missing step 'zzz'"]),
    "a step that continues at itself": (pipeline(step("a", next="a")), ["loop that can run forever: a -> a"]),
    "a fallback loop": (pipeline(step("train", on_fail="fix"), step("fix", next="train")),
                        ["loop that can run forever", "train", "fix", "max_retries"]),
    "a loop through the following step": (pipeline(step("a"), step("b"), step("c", next="a")),
                                          ["loop that can run forever: a -> b -> c -> a"]),
    # x is skipped on every lap (the step before it succeeded), so its max_retries bounds nothing.
    "a loop bounded only by a step with a condition": (
        pipeline(step("w"), step("x", condition="prev.error", max_retries=0), step("y", next="w")),
        ["loop that can run forever: w -> x -> y -> w; bound it with max_retries on one of its steps that has no "
         "condition (a step with a condition can be skipped on every lap)"]),
    "a timeout too large for a float": (pipeline(step("a", timeout=10 ** 400)),
                                        ["timeout must be a positive number of seconds up to 31536000", "(401 characters)"]),
    "an infinite deadline": (pipeline(step("a"), deadline_seconds=float("inf")), ["deadline_seconds must be a positive number of seconds up to", "got inf"]),
    "a NaN timeout (it passes every comparison)": (pipeline(step("a", timeout=float("nan"))), ["timeout must be a finite number, got nan"]),
    "a memory integer too large for a float": (pipeline(step("a", memory=10 ** 400)), ["memory must be at most 2**63"]),
    "a memory size too large for a float": (pipeline(step("a", memory="1" + "0" * 400 + "g")),
                                            ["memory must be at most 2**63"]),
    "a step id ending in a newline": (pipeline(step("a\n")), ["step id 'a\\n' is malformed"]),
    "a pipeline name ending in a newline": (pipeline(step("a"), name="p\n"), ["pipeline name 'p\\n' is malformed"]),
    "a pool name ending in a newline": (pipeline(step("a", resources={"licence\n": 1})), ["pool name 'licence\\n'"]),
    "an env name ending in a newline": (pipeline(step("a", env={"A\n": "1"})), ["env name 'A\\n'"]),
    "a python target ending in a newline": (pipeline({"id": "a", "python": "m:f\n"}), ["python must be 'module:function'"]),
    "unknown step field": (pipeline(step("a", timout=3)), ["step 'a'", "unknown field 'timout'", "did you mean 'timeout'"]),
    "unknown pipeline field": (pipeline(step("a"), deadline=3), ["unknown field 'deadline'", "did you mean 'deadline_seconds'"]),
    "unknown file field": ({"pipelines": [pipeline(step("a"))], "pipeline": []}, ["unknown field 'pipeline'", "did you mean 'pipelines'"]),
    "unknown mount field": (pipeline(step("a", container="docker://x", mounts=[{"host_path": "/d", "container_path": "/d", "read_only": True}])),
                            ["unknown field 'read_only'", "did you mean 'readonly'"]),
    "negative timeout": (pipeline(step("a", timeout=-5)), ["timeout must be a positive number of seconds", "got -5"]),
    "zero timeout": (pipeline(step("a", timeout=0)), ["timeout must be a positive number", "got 0"]),
    "non-numeric timeout": (pipeline(step("a", timeout="10s")), ["timeout must be a positive number of seconds", "got '10s'"]),
    "boolean timeout": (pipeline(step("a", timeout=True)), ["timeout must be a positive number of seconds", "got true"]),
    "null condition (JSON's spelling in the message)": (pipeline(step("a", condition=None)), ["condition must be one of", "got null"]),
    "a step that is an array": (pipeline(["a"]), ["a step must be an object", "got an array"]),
    "an env value that is an array of literals": (pipeline(step("a", env={"A": [True, None]})), ['got [true, null]']),
    "memory without a unit": (pipeline(step("a", memory=16)), ["memory must be at least 1 MiB, got 16, which is 16 bytes",
                                                                "write '16g' for 16 GiB"]),
    "negative deadline": (pipeline(step("a"), deadline_seconds=-1), ["deadline_seconds must be a positive number"]),
    "bad memory unit": (pipeline(step("a", memory="16x")), ["memory must be a size such as '16g'", "'16x'"]),
    "memory in words": (pipeline(step("a", memory="lots")), ["memory must be a size"]),
    "negative memory": (pipeline(step("a", memory=-1)), ["memory must be more than 0 bytes"]),
    "command and python": (pipeline(step("a", python="m:f")), ["exactly one of 'command'"]),
    "neither command nor python": (pipeline({"id": "a"}), ["exactly one of 'command'"]),
    "python without a function": (pipeline({"id": "a", "python": "module.only"}), ["python must be 'module:function'"]),
    "bad condition": (pipeline(step("a", condition="prev.failed")), ["condition must be one of prev.ok, prev.error"]),
    "negative max_retries": (pipeline(step("a", max_retries=-1)), ["max_retries must be a whole number from 0 to 1000"]),
    "gpu not a boolean": (pipeline(step("a", gpu="yes")), ["gpu must be true or false"]),
    "two GPUs": (pipeline(step("a", resources={"gpu": 2})), ["at most one GPU"]),
    "the gpu pool with gpu false (the format's logical resource)": (
        pipeline(step("a", gpu=False, resources={"GPU": 1})), ["step 'a'", "gpu: false with resources", "a pool of its own"]),
    "bad env": (pipeline(step("a", env={"A B": "1"})), ["not a valid variable name"]),
    "mounts without a container": (pipeline(step("a", mounts=[])), [
        "mounts need a container image and none is given", '"container"', "--container IMAGE", "PIPELINE_CONTAINER"]),
    "a prompt naming /shared with no image (the node's own folder, every run's)": (
        pipeline({"id": "train", "prompt": "Save the checkpoint to /shared/checkpoints/model_final.pt."}),
        ["step 'train'", "its prompt names /shared, which is this pipeline's shared folder only in a container",
         '"container"', "--container IMAGE", "PIPELINE_CONTAINER", '"the shared folder" without a path',
         "$PIPELINE_SHARED"]),
    "a prompt naming /shared in a Markdown code span with no image": (
        pipeline({"id": "t", "prompt": "Save it to `/shared/checkpoints/model.pt` please (`/shared`)."}),
        ["step 't'", "its prompt names /shared"]),
    "a prompt naming /shared in a double-backtick code span with no image": (
        pipeline({"id": "t", "prompt": "Save it to ``/shared/checkpoints/model.pt`` please."}),
        ["step 't'", "its prompt names /shared"]),
    "an on_fail step whose condition prev.ok never holds after a failure": (
        pipeline(step("a", command="false", on_fail="x"), step("x", condition="prev.ok"), step("y")),
        ["step 'a'", "on_fail names step 'x', whose condition prev.ok never holds after a failure",
         "drop that condition or give on_fail another step"]),
    "a prompt quoting /shared in JSON with no image": (pipeline({"id": "e", "prompt": 'Write {"out": "/shared/m.json"}'}),
                                                        ["step 'e'", "its prompt names /shared"]),
    "mounts of an image that does not exist": (pipeline(step("a", container="/x", mounts=[{"host_path": "/d", "container_path": "d"}])),
                                ["container_path must be an absolute path"]),
    "container image that does not exist": (pipeline(step("a", container="/no/such/image.sif")),
                                            ["container image '/no/such/image.sif' does not exist"]),
    "a container image name over the file system's limit": (pipeline(step("a", container="a" * 300 + ".sif")),
                                                            ["container image 'aaa", "cannot look for it (File name too long)"]),
    "malformed pipeline name": (pipeline(step("a"), name="my pipeline"), ["pipeline name 'my pipeline' is malformed"]),
    "pipeline name escaping the results folder": (pipeline(step("a"), name=".."), ["malformed"]),
    "a step id too long for a folder name": (pipeline(step("s" * 300)), ["longer than 100 characters"]),
    "a pipeline name too long for a folder name": (pipeline(step("a"), name="p" * 300), ["longer than 100"]),
    "a NUL in a command": (pipeline(step("a", command="echo a\0b")), ["NUL character"]),
    "a NUL in an env value": (pipeline(step("a", env={"X": "a\0b"})), ["env X: value holds a NUL"]),
    "reserved pipeline name": (pipeline(step("a"), name="logs"), ["reserved"]),
    "duplicate pipeline names": ({"pipelines": [pipeline(step("a")), pipeline(step("b"))]}, ["duplicate pipeline name 'p'"]),
    "no steps": (pipeline(), ["steps must be a non-empty list"]),
    "not an object": ("steps", ["expected a pipeline object", "a list of tasks (par)"]),
    "a list of tasks that are not objects": ([1, 2], ["task #1: a task must be an object, got 1"]),
    "a par task with a step's on_fail": ([{"command": "true", "on_fail": "report"}],
                                         ["task 'task-1'", "'on_fail' is a field of a pipeline's steps, not of a par task"]),
    "a par task with a step's condition": ({"tasks": [{"command": "true"}, {"command": "true", "condition": "prev.ok"}]},
                                           ["task 'task-2'", "'condition' is a field of a pipeline's steps"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_each_bad_definition_is_one_clear_line(case):
    data, fragments = BAD[case]
    message = problem(data)
    for fragment in fragments:
        assert fragment in message, message


def test_shared_is_refused_only_where_no_container_binds_it(tmp_path):
    """The format's /shared is the pipeline's own folder only in a container (bound at /shared); on
    the node it is the node's, so a prompt naming it needs an image, from the step, its pipeline, the
    file or --container. Another folder that ends in /shared is not it; commands (this runner's own
    kind of step, given $PIPELINE_SHARED) are not checked: a /shared there may be the cluster's own
    file system, or a folder inside a container the command starts itself."""
    image = tmp_path / "image.sif"
    image.write_bytes(b"sif")
    prompt = {"id": "train", "prompt": "Save the checkpoint to /shared/checkpoints/model_final.pt."}
    for data, default in [(pipeline(dict(prompt, container=str(image))), None),
                          (pipeline(prompt, container=str(image)), None),
                          ({"container": str(image), "pipelines": [pipeline(prompt)]}, None),
                          (pipeline(prompt), str(image))]:
        [parsed] = parse_definition(data, "def.json", tmp_path, default_image=default)
        assert parsed.steps[0].container == str(image)
    for text in ["Read /home/me/shared/x, /shared.old, /shared-data and ~/shared", "Write to the shared folder",
                 'Run mkdir -p "$PIPELINE_STEP_DIR"/shared and $(pwd)/shared and `pwd`/shared', "Copy it to node2:/shared/x",
                 "Fetch http://host/shared/x"]:
        parse_definition(pipeline({"id": "a", "prompt": text}), "def.json", tmp_path)
    for text in ["cp out.pt /shared/x", "python train.py --data /shared/datasets/mnist",
                 "apptainer exec --bind $PIPELINE_SHARED:/shared img.sif python /shared/train.py"]:
        parse_definition(pipeline(step("a", command=text)), "def.json", tmp_path)


def test_a_mount_container_path_must_be_absolute(tmp_path):
    image = tmp_path / "image.sif"
    image.write_bytes(b"sif")
    message = problem(pipeline(step("a", container=str(image), mounts=[{"host_path": "/d", "container_path": "d"}])))
    assert "container_path must be an absolute path" in message


def test_a_mount_apptainer_would_read_otherwise_is_refused(tmp_path):
    """"//shared" is /shared to apptainer (POSIX leaves two leading slashes apart, normpath kept
    them); a ',' or ':' in either path is one of --bind's separators, so the bind would be another;
    a relative host_path is refused where the definition's own folder holds one."""
    image = tmp_path / "image.sif"
    image.write_bytes(b"sif")

    def mounted(host: str, inside: str, base: Path = Path(".")) -> str:
        return problem(pipeline(step("a", container=str(image), mounts=[{"host_path": host, "container_path": inside}])),
                       base)

    assert "/shared is where the pipeline's shared folder is bound" in mounted("/d", "//shared")
    assert "/shared is where the pipeline's shared folder is bound" in mounted("/d", "///shared/x")
    for host, inside, what in (("/a,b", "/d", "host_path"), ("/d", "/x,/y", "container_path")):
        assert f"mount {what} must be a path without ':' or ','" in mounted(host, inside)
    assert "container_path must be an absolute path without ':'" in mounted("/d", "/x:ro")
    assert "whose ':' or ',' apptainer's --bind would read as separators" in mounted("data", "/data",
                                                                                   tmp_path / "a,b")


def test_a_loop_bounded_by_max_retries_is_accepted():
    pipelines = parse_definition(pipeline(step("train", on_fail="fix"), step("fix", next="train", max_retries=2)))
    assert unbounded_cycle(pipelines[0]) == []
    assert pipelines[0].steps[1].max_retries == 2


def test_whole_numbers_written_with_a_point_are_kept_as_integers():
    """JSON Schema counts 2.0 as an integer: the plan and the records say 2, not 2.0; a memory
    written so is its bytes (it was refused as no size)."""
    [p] = parse_definition(pipeline(step("a", max_retries=2.0, resources={"licence": 3.0}, memory=17179869184.0)))
    assert repr(p.steps[0].max_retries) == "2" and repr(p.steps[0].resources["licence"]) == "3"
    assert p.steps[0].memory == 16 << 30


def test_a_jump_forward_is_not_a_loop():
    [p] = parse_definition(pipeline(step("a", next="c"), step("b"), step("c", on_fail="d"), step("d")))
    assert unbounded_cycle(p) == []


def test_memory_sizes():
    assert parse_memory("16g") == 16 * 1024 ** 3
    assert parse_memory("512m") == 512 * 1024 ** 2
    assert parse_memory("1.5GiB") == int(1.5 * 1024 ** 3)
    assert parse_memory("100 MB") == 100 * 1024 ** 2
    assert parse_memory(4 * 2 ** 20) == 4 * 2 ** 20  # a number without a unit is bytes, as Docker's --memory
    for bad in ("16x", "g", "", "-1g", "0", True, 16, "16", "512k"):
        with pytest.raises(ValueError):
            parse_memory(bad)
    # the hint for a unit left out, and only then
    for bad, hint in ((16, "write '16g' for 16 GiB"), (" 2.5 ", "write '2.5g' for 2.5 GiB"), ("512k", None),
                      ("100b", None)):
        with pytest.raises(ValueError) as caught:
            parse_memory(bad)
        assert ("a number without a unit is bytes" in str(caught.value)) == (hint is not None), caught.value
        assert hint is None or hint in str(caught.value)


def test_unknown_pools_and_pools_too_small():
    [p] = parse_definition(pipeline(step("a", resources=["licence"]), step("b", resources={"disk": 3})))
    with pytest.raises(UsageError, match="unknown pool 'licence'.*PIPELINE_RESOURCE_LICENCE=N or the format document's SWARM_RESOURCE_licence=N"):
        check_pools([p], {"gpu": None, "disk": 4}, "def.json")
    with pytest.raises(UsageError, match="asks 3 of pool 'disk', which has capacity 2"):
        check_pools([p], {"gpu": None, "disk": 2, "licence": 1}, "def.json")
    check_pools([p], {"gpu": None, "disk": 3, "licence": 1}, "def.json")


def test_relative_image_paths_are_relative_to_the_definition_file(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "torch.sif").write_bytes(b"sif")
    definition = tmp_path / "p.json"
    definition.write_text(json.dumps(pipeline(step("a", container="images/torch.sif", gpu=True,
                                                   mounts=[{"host_path": "data", "container_path": "/data", "readonly": True}]))))
    [p] = load_definition(definition)
    assert p.steps[0].container == str(tmp_path / "images" / "torch.sif")
    assert p.steps[0].mounts[0].host_path == str(tmp_path / "data") and p.steps[0].mounts[0].readonly


def test_yaml_definitions(tmp_path):
    definition = tmp_path / "p.yaml"
    definition.write_text("name: y\nsteps:\n  - id: a\n    command: echo hi\n    timeout: 5\n    memory: 512m\n")
    [p] = load_definition(definition)
    assert (p.name, p.steps[0].timeout, p.steps[0].memory) == ("y", 5.0, 512 * 1024 ** 2)
    definition.write_text("name: y\nsteps: [\n")
    with pytest.raises(UsageError, match="not valid YAML"):
        load_definition(definition)


def test_a_byte_order_mark_is_read_past_and_a_pasted_call_is_named(tmp_path):
    """Editors on Windows start UTF-8 files with a byte-order mark: JSON and YAML are read past it.
    The format document's ``pipeline(definition='...')`` pasted whole is not JSON: the line says
    what to keep."""
    for name, text in (("p.json", json.dumps(pipeline(step("a")))), ("p.yaml", "name: p\nsteps:\n  - id: a\n    command: 'true'\n")):
        definition = tmp_path / name
        definition.write_bytes(b"\xef\xbb\xbf" + text.encode())
        assert [p.name for p in load_definition(definition)] == ["p"]
    pasted = tmp_path / "pasted.json"
    pasted.write_text(f"pipeline(definition='{json.dumps(pipeline(step('a')))}')")
    with pytest.raises(UsageError, match=r"not valid JSON: .*\(this is a pipeline\(\.\.\.\) or par\(\.\.\.\) call: keep "
                                         r"only the JSON between its quotes\)"):
        load_definition(pasted)


def test_the_shipped_examples_are_valid():
    [ml] = load_definition(EXAMPLES / "ml.json")
    assert ml.step_ids == ["train", "train-retry", "evaluate", "report"]
    assert ml.steps[0].gpu and ml.steps[0].on_fail == "train-retry" and ml.steps[1].condition == "prev.error"
    sweep = load_definition(EXAMPLES / "sweep.json")
    assert len(sweep) >= 3 and len({p.name for p in sweep}) == len(sweep)


def test_bad_definitions_from_the_command_line_exit_2_and_write_nothing(tmp_path, monkeypatch):
    results = tmp_path / "results"
    cases = [
        (pipeline(step("a", timout=3)), ["unknown field 'timout'", "did you mean 'timeout'"]),
        (pipeline(step("a", next="a")), ["loop that can run forever"]),
        (pipeline(step("a", resources=["licence"])), ["unknown pool 'licence'"]),
        (pipeline(step("a", timeout=10 ** 400)), ["timeout must be a positive number of seconds up to"]),
        (pipeline(step("a", memory="1" + "0" * 400 + "g")), ["memory must be at most"]),
    ]
    for number, (data, fragments) in enumerate(cases):
        definition = tmp_path / f"bad{number}.json"
        definition.write_text(json.dumps(data))
        proc = run(["-m", "common.pipeline", str(definition), "--results", str(results), "--gpu", "cpu", "--no-progress"])
        assert_usage_error(proc, str(definition), *fragments)
        assert not results.exists()
    # An existing results folder is left exactly as it was.
    results.mkdir()
    (results / "keep.txt").write_text("mine")
    before = snapshot(results)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(pipeline(step("a"))))
    for extra, fragments in ((["--resource", "licence"], ["--resource 'licence'", "NAME=N"]),
                             (["--resource", "gpu=0"], ["capacity must be at least 1"]),
                             (["--queue-timeout", "-3"], ["--queue-timeout"]),
                             (["--queue-timeout", "1e300"], ["up to 31,536,000"]),
                             (["--resume", "p"], ["RUN_ID/STEP_ID"]),
                             (["--resume", "p/b"], ["pipeline 'p' has no step 'b'"]),
                             (["--resume", "q/a"], ["no pipeline 'q'"]),
                             (["--resume", "p/a"], ["does not exist; nothing to resume"])):
        proc = run(["-m", "common.pipeline", str(good), "--results", str(results), "--gpu", "cpu", "--no-progress", *extra])
        assert_usage_error(proc, *fragments)
    bad_json = tmp_path / "broken.json"
    bad_json.write_text("{\"name\": \"p\", ")
    assert_usage_error(run(["-m", "common.pipeline", str(bad_json), "--results", str(results), "--gpu", "cpu"]),
                       "not valid JSON")
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    assert_usage_error(run(["-m", "common.pipeline", str(deep), "--results", str(results), "--gpu", "cpu"]),
                       "not valid JSON: nested too deeply")
    assert_usage_error(run(["-m", "common.pipeline", str(tmp_path / "missing.json"), "--results", str(results),
                            "--gpu", "cpu"]), "no such pipeline definition")
    boxed = tmp_path / "boxed.json"  # a container step, and PIPELINE_APPTAINER naming nothing: said so, not PATH
    boxed.write_text(json.dumps(pipeline(step("a", container=str(good)))))
    monkeypatch.setenv("PIPELINE_APPTAINER", "/nonexistent/apptainer")
    assert_usage_error(run(["-m", "common.pipeline", str(boxed), "--results", str(results), "--gpu", "cpu"]),
                       "a step runs in a container, but PIPELINE_APPTAINER='/nonexistent/apptainer' names no program")
    assert snapshot(results) == before


def test_files_beyond_what_json_holds_are_one_line(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("{\"a\": " * 100_000 + "1" + "}" * 100_000)
    with pytest.raises(UsageError, match="nested too deeply"):
        load_definition(deep)
    digits = tmp_path / "digits.json"
    digits.write_text(json.dumps(pipeline(step("a"))).replace('"true"', '"true", "timeout": ' + "9" * 5000))
    with pytest.raises(UsageError) as caught:
        load_definition(digits)
    assert "not valid JSON" in str(caught.value) and "\n" not in str(caught.value)


def test_a_copy_of_the_example_with_one_typo_is_refused(tmp_path):
    data = json.loads((EXAMPLES / "ml.json").read_text())
    broken = copy.deepcopy(data)
    broken["steps"][2]["on_fial"] = broken["steps"][2].pop("on_fail")
    message = problem(broken, EXAMPLES)
    assert "step 'evaluate'" in message and "did you mean 'on_fail'" in message


def test_pool_capacities_from_the_environment_and_flags():
    from common.pipeline.app import configured_pools, queue_timeout

    environ = {"PIPELINE_RESOURCE_LICENCE": "2", "PIPELINE_RESOURCE_GPU": "4", "OTHER": "1"}
    assert configured_pools([], environ) == {"licence": 2, "gpu": 4}
    assert configured_pools(["gpu=1", "Disk=3"], environ) == {"licence": 2, "gpu": 1, "disk": 3}
    with pytest.raises(UsageError, match="PIPELINE_RESOURCE_LICENCE: capacity must be a whole number"):
        configured_pools([], {"PIPELINE_RESOURCE_LICENCE": "many"})
    # a bad value left in the environment is refused only where nothing later replaces it
    stale = {"SWARM_RESOURCE_gpu": "all", "PIPELINE_RESOURCE_LICENCE": "0"}
    assert configured_pools(["gpu=2", "licence=1"], stale) == {"gpu": 2, "licence": 1}
    assert configured_pools(["licence=1"], {"SWARM_RESOURCE_gpu": "all", "PIPELINE_RESOURCE_GPU": "3"}) == {
        "gpu": 3, "licence": 1}
    with pytest.raises(UsageError, match="SWARM_RESOURCE_gpu: capacity must be a whole number, got 'all'"):
        configured_pools(["licence=1"], stale)
    with pytest.raises(UsageError, match="expected NAME=N"):
        configured_pools(["licence\n=1"], {})
    # one pool in two flags (the later silently won): which one was meant?
    with pytest.raises(UsageError, match=r"^--resource 'Foo=2': pool 'foo' is already given by --resource 'foo=1' "
                                         r"\(pool names ignore case\); give it once$"):
        configured_pools(["foo=1", "Foo=2"], {})
    # set empty (a job script's VAR= to clear it): as unset, as every setting and SWARM_QUEUE_TIMEOUT=''
    assert configured_pools([], {"SWARM_RESOURCE_gpu": "", "PIPELINE_RESOURCE_LICENCE": " "}) == {}
    assert configured_pools([], {"SWARM_RESOURCE_gpu": "2", "PIPELINE_RESOURCE_GPU": ""}) == {"gpu": 2}
    assert queue_timeout(None, {"SWARM_QUEUE_TIMEOUT": ""}) is None
    with pytest.raises(UsageError, match="expected|capacity"):
        configured_pools(["gpu="], {})  # a flag is never empty by accident
    assert queue_timeout(None, {"PIPELINE_QUEUE_TIMEOUT": "30"}) == 30.0
    assert queue_timeout(5.0, {"PIPELINE_QUEUE_TIMEOUT": "30"}) == 5.0
    assert queue_timeout(None, {}) is None
    with pytest.raises(UsageError, match="PIPELINE_QUEUE_TIMEOUT"):
        queue_timeout(None, {"PIPELINE_QUEUE_TIMEOUT": "soon"})


def test_a_key_given_twice_is_refused_in_json_and_yaml(tmp_path):
    results = tmp_path / "results"
    twice = tmp_path / "twice.json"
    twice.write_text('{"name": "p", "steps": [{"id": "a", "command": "true", "timeout": 5, "timeout": 500}]}')
    proc = run(["-m", "common.pipeline", str(twice), "--results", str(results), "--gpu", "cpu", "--no-progress"])
    assert_usage_error(proc, "twice.json: not valid JSON: duplicate key 'timeout'")
    assert not results.exists()
    yaml_twice = tmp_path / "twice.yaml"
    yaml_twice.write_text("name: p\nsteps:\n  - id: a\n    command: 'true'\n    command: 'rm -rf x'\n")
    with pytest.raises(UsageError, match="not valid YAML: .*duplicate key 'command'"):
        load_definition(yaml_twice)


def yaml_aliases(levels: int) -> str:
    """Lists b, c, ... each naming the one before nine times: the last stands for 9**(levels + 1)
    strings of the 'a' below once written out, in a few hundred bytes."""
    return "".join(f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 9) + "]\n"
                   for i in range(levels))


def aliased_definition(tmp_path: Path, levels: int, place: str) -> Path:
    definition = tmp_path / "aliases.yaml"
    definition.write_text("x-defs:\n  a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
                          + "".join("  " + line + "\n" for line in yaml_aliases(levels).splitlines())
                          + f"name: p\nsteps:\n  - id: s\n    command: 'true'\n    {place}\n")
    return definition


@pytest.mark.parametrize("place", ["env: {X: *e}", "timeout: *e", "resources: *e", "tools: *e", "mounts: *e"])
def test_a_value_of_nested_yaml_aliases_makes_a_short_message_at_once(tmp_path, place):
    """issue 22: 410 bytes of aliases made a one-line error of 6 MB (its full repr, built before cutting).
    Here 59,049 strings (half a megabyte of repr), under the aliases' limit: the step's own check says it."""
    definition = aliased_definition(tmp_path, 4, place)
    began = time.monotonic()
    with pytest.raises(UsageError) as caught:
        load_definition(definition)
    message = str(caught.value)
    assert time.monotonic() - began < 5
    assert len(message) < 400 and "\n" not in message and "step 's'" in message, message


def test_yaml_aliases_standing_for_too_many_values_or_for_themselves_are_refused_at_once(tmp_path):
    """9**9 (387 million) strings in under 1,000 bytes, wherever they are named (here by nothing the
    runner reads: every value of the file is written out by some reader), and a list holding itself."""
    definition = aliased_definition(tmp_path, 8, "env: {X: '1'}")
    assert len(definition.read_bytes()) < 1000
    began = time.monotonic()
    with pytest.raises(UsageError, match=r"aliases.yaml: its aliases \(\*name\) stand for more than 1,000,000 values "
                                         r"once written out: repeat less, or write the repeated part out once$"):
        load_definition(definition)
    assert time.monotonic() - began < 5
    text = tmp_path / "text.yaml"  # a megabyte's text named 1,000 times: a gigabyte once written out
    text.write_text(f"name: p\nx-big: &s {'x' * 1_000_000}\nx-many: [{', '.join(['*s'] * 1000)}]\n"
                    f"steps:\n  - id: s\n    command: 'true'\n")
    with pytest.raises(UsageError, match="stand for more than 1,000,000 values once written out"):
        load_definition(text)
    itself = tmp_path / "itself.yaml"
    itself.write_text("name: p\nx: &x [1, *x]\nsteps:\n  - id: s\n    command: 'true'\n")
    with pytest.raises(UsageError, match=r"itself.yaml: a list or mapping that contains itself \(an alias \*name used "
                                         r"inside what it names\)$"):
        load_definition(itself)


def test_a_command_longer_than_the_system_takes_is_refused_at_validation():
    message = problem(pipeline(step("a", command="echo " + "x" * 200_000)))
    assert "command is 200,005 bytes; the system passes at most 131,071 bytes in one argument" in message
    message = problem(pipeline(step("a", env={"BIG": "y" * 140_000})))
    assert "env BIG is 140,004 bytes" in message
    many = {f"V{i}": "z" * 100_000 for i in range(25)}  # each fits, together past ARG_MAX
    assert "more than the system's limit on a command line" in problem(pipeline(step("a", env=many)))
    parse_definition(pipeline(step("a", command="echo " + "x" * 100_000)))  # long, but it runs


MATRIX_BAD = {
    "an empty list of values": ({"lr": []}, "matrix lr must be a non-empty list of values, got []"),
    "a name that is no variable": ({"learning rate": [1]}, "matrix name 'learning rate' is not a valid name"),
    "a value that is a list": ({"lr": [[1, 2]]}, "each of lr must be a string, number or boolean"),
    "not an object": ([1, 2], "matrix must be an object of name: [values], got [1, 2]"),
    "too many combinations": ({f"k{i}": list(range(10)) for i in range(4)}, "matrix makes 10,000 pipelines, more than 1000"),
}


@pytest.mark.parametrize("case", sorted(MATRIX_BAD))
def test_bad_matrices_are_one_line(case):
    matrix, fragment = MATRIX_BAD[case]
    assert fragment in problem(pipeline(step("a"), matrix=matrix))


def test_prompt_steps_and_their_fields():
    [p] = parse_definition(pipeline({"id": "ask", "prompt": "Summarise", "model": "big", "tools": ["web", "files"]}))
    assert (p.steps[0].kind, p.steps[0].model, p.steps[0].tools) == ("prompt", "big", ("web", "files"))
    assert "exactly one of 'command'" in problem(pipeline({"id": "a", "prompt": "x", "command": "true"}))
    assert "model is only for prompt steps" in problem(pipeline(step("a", model="big")))
    assert "tools lists an entry twice" in problem(pipeline({"id": "a", "prompt": "x", "tools": ["web", "web"]}))
    assert "budget must be a positive number" in problem(pipeline(step("a"), budget=0))
    assert "retry_delay must be a number of seconds from 0 to 86400" in problem(pipeline(step("a", retry_delay=-1)))


def test_a_definition_that_is_a_pipe_a_device_or_holds_lone_surrogates_is_one_line(tmp_path, monkeypatch):
    """A named pipe is read once its writer comes (and waits for it a bounded time, not for ever
    through stop signals), /dev/zero is refused at 64 MiB instead of filling the memory, and text
    that cannot be written as UTF-8 (JSON's ``\\ud800``) is refused before anything runs, instead of
    failing the step that hands it to its program."""
    import os
    import subprocess
    import threading

    import common.userfile as userfile

    document = json.dumps(pipeline(step("a", command="echo hi")))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = threading.Timer(0.3, lambda: fifo.write_text(document))
    writer.start()
    assert [p.name for p in load_definition(fifo)] == ["p"]
    writer.join()
    monkeypatch.setattr(userfile, "PIPE_WAIT_SECONDS", 0.5)
    started = time.monotonic()
    with pytest.raises(UsageError, match="a named pipe that nothing came through for 0.5 s: nobody writes to it"):
        load_definition(fifo)  # nobody writes
    assert time.monotonic() - started < 5
    slow = tmp_path / "slow.sh"  # a generator slower than the wait, given as an anonymous pipe: waited for
    slow.write_text(f"sleep 1.5; cat <<'EOF'\n{document}\nEOF\n")
    generator = subprocess.Popen(["sh", str(slow)], stdout=subprocess.PIPE)
    try:
        assert [p.name for p in load_definition(Path(f"/proc/self/fd/{generator.stdout.fileno()}"))] == ["p"]
    finally:
        generator.stdout.close()
        generator.wait()
    with pytest.raises(UsageError, match="larger than 64 MiB: not a pipeline definition"):
        load_definition(Path("/dev/zero"))
    for text in (r'{"name": "x", "steps": [{"id": "a", "command": "echo ' + "x" * 100 + r'\ud800"}]}',
                 r'{"name": "x", "steps": [{"id": "a", "prompt": "hi \udc80"}]}',
                 r'{"name": "x", "steps": [{"id": "a", "command": "echo", "env": {"A": "\udfff"}}]}'):
        path = tmp_path / "surrogate.json"
        path.write_text(text)
        with pytest.raises(UsageError, match=r"holds a lone surrogate") as caught:
            load_definition(path)
        assert "\\ud" in str(caught.value) or "\\udc80" in str(caught.value), caught.value  # the text around it
    yaml_path = tmp_path / "surrogate.yaml"
    yaml_path.write_text('name: x\nsteps:\n  - id: a\n    command: "echo \\ud800"\n')
    with pytest.raises(UsageError, match="holds a lone surrogate"):
        load_definition(yaml_path)


def test_yaml_merge_keys_give_steps_shared_defaults_that_each_may_override(tmp_path):
    """``<<: *defaults`` (YAML's merge key) was refused as "could not determine a constructor for
    the tag merge": the duplicate-key check built every key before PyYAML resolved the merge. A key
    the step sets itself overrides the merged one; a key given twice by the step is still refused."""
    definition = tmp_path / "merged.yaml"
    definition.write_text("name: p\nsteps:\n"
                          "  - &gpu {id: train, command: 'true', gpu: true, timeout: 600, max_retries: 1}\n"
                          "  - {<<: *gpu, id: evaluate, timeout: 60}\n")
    [p] = load_definition(definition)
    assert [(s.id, s.gpu, s.timeout, s.max_retries) for s in p.steps] == [("train", True, 600.0, 1),
                                                                         ("evaluate", True, 60.0, 1)]
    definition.write_text("name: p\nsteps:\n  - &d {id: a, command: 'true'}\n  - {<<: *d, id: b, gpu: true, id: c}\n")
    with pytest.raises(UsageError, match="duplicate key 'id'"):
        load_definition(definition)
