"""Ray without a shared disk: with a staging prefix on the real local S3 server (SeaweedFS), the tasks' files cross
the bucket and the run's data root stays on the run's machine.

The unit tests run the staging module's two sides in this process (no Ray): a task's files pushed to the bucket,
pulled into a node folder, its outputs pushed back and published into the data root. The cluster test runs the
whole graph on a two-node local Ray cluster (ray.cluster_utils.Cluster, one CPU each, each node with its own cache
folder) and compares every published file with the local engine's; an audit hook in every Ray worker of the run
(`sys.addaudithook`, installed by the job's worker setup hook) records each file operation on a path under the
run's data root, and none may happen but the control's (a task run with the data root shared)."""

import functools
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pytest

from tokenmill.common.io import file_sha256
from tokenmill.common.remote import Retries
from tokenmill.common.staging import (
    NODE_CACHE_VARIABLE,
    OBJECTS,
    DataRootStager,
    StagedFile,
    StagingArea,
    TaskFiles,
    named_paths,
    rebased,
    run_staged,
)
from tokenmill.errors import ComputeError, ConfigError

SEEN_FOLDERS: list[Path] = []  # where count_words ran (in this process)


@dataclass(frozen=True, kw_only=True)
class WordTask:
    texts: Path  # a folder: every file in it is read
    stem: str  # a stem: its files are <stem>.<suffix>
    out: str  # a file in a folder the task makes
    spent: Path  # an input the task removes


def count_words(task: WordTask) -> dict:
    SEEN_FOLDERS.append(task.texts)
    words = sum(len(p.read_text().split()) for p in sorted(task.texts.iterdir()))
    words += len(Path(f"{task.stem}.keys").read_text().split())
    Path(task.out).parent.mkdir(exist_ok=True)
    Path(task.out).write_text(f"{words}\n")
    task.spent.unlink()
    return {"words": words, "out": Path(task.out)}


def test_a_task_runs_in_a_node_folder_filled_and_emptied_through_the_bucket(s3_env, tmp_path):
    s3_env.make_bucket("staging-unit")
    root = tmp_path / "data"
    (root / "stage" / "texts").mkdir(parents=True)
    (root / "stage" / "texts" / "a.txt").write_text("one two three")
    (root / "stage" / "texts" / "b.txt").write_text("one two three")  # the same bytes: one object
    (root / "stage" / "stem.keys").write_text("four five")
    (root / "stage" / "stem.doc").write_bytes(b"\0" * 1000)
    (root / "stage" / "spent.bin").write_bytes(b"spent")
    (root / "stage" / "unnamed.bin").write_bytes(b"never staged")
    task = WordTask(
        texts=root / "stage" / "texts",
        stem=str(root / "stage" / "stem"),
        out=str(root / "stage" / "counts" / "words.txt"),
        spent=root / "stage" / "spent.bin",
    )
    stager = DataRootStager(StagingArea("s3://staging-unit/run"), root)

    inputs = stager.inputs(named_paths(task, str(root)))
    assert [f.rel for f in inputs.files] == [
        "stage/spent.bin",
        "stage/stem.doc",
        "stage/stem.keys",
        "stage/texts/a.txt",
        "stage/texts/b.txt",
    ]
    assert stager.traffic.up == 5 + 1000 + 9 + 13  # b.txt's bytes are a.txt's object
    objects = s3_env.client().list_objects_v2(Bucket="staging-unit", Prefix=f"run/{OBJECTS}/")["Contents"]
    assert len(objects) == 4

    cache = tmp_path / "node"
    result, outputs, traffic = run_staged(
        count_words, task, data_root=str(root), area=stager.area, inputs=inputs, cache=cache
    )
    assert SEEN_FOLDERS[-1].is_relative_to(cache) and not SEEN_FOLDERS[-1].exists()  # a node folder, removed after
    assert result == {"words": 8, "out": root / "stage" / "counts" / "words.txt"}  # paths moved back
    assert traffic.down == 5 + 1000 + 9 + 13 and traffic.up == 2
    assert [f.rel for f in outputs.files] == ["stage/counts/words.txt"]
    assert outputs.folders == ("stage/counts",) and outputs.removed == ("stage/spent.bin",)
    assert not (root / "stage" / "counts").exists()  # nothing reaches the data root before it is published

    stager.publish(outputs)
    assert (root / "stage" / "counts" / "words.txt").read_text() == "8\n"
    assert not (root / "stage" / "spent.bin").exists()
    assert sorted(p.name for p in (root / "stage").iterdir() if p.name.startswith(".")) == []  # no partial left
    assert stager.traffic.down == 2

    # the next step: what is staged already is neither read nor uploaded again, on either side
    (root / "stage" / "texts" / "c.txt").write_text("six")
    (root / "stage" / "spent.bin").write_bytes(b"spent")  # written again, the same bytes: nothing to upload
    again = stager.inputs(named_paths(task, str(root)) | {str(root / "stage" / "counts")})
    assert stager.traffic.up == 5 + 1000 + 9 + 13 + 3  # c.txt only (words.txt came from the bucket)
    assert "stage/counts/words.txt" in {f.rel for f in again.files}
    _, _, second = run_staged(count_words, task, data_root=str(root), area=stager.area, inputs=again, cache=cache)
    assert second.down == 3  # the node's cache held every other object, its own output included


def read_missing(task: WordTask) -> None:
    Path(task.stem).read_text()


def test_a_task_error_names_the_data_root_path(s3_env, tmp_path):
    s3_env.make_bucket("staging-error")
    root = tmp_path / "data"
    (root / "stage").mkdir(parents=True)
    task = WordTask(texts=root, stem=str(root / "stage" / "absent"), out=str(root / "o"), spent=root / "x")
    stager = DataRootStager(StagingArea("s3://staging-error/run"), root)
    inputs = stager.inputs(named_paths(task, str(root)))
    with pytest.raises(FileNotFoundError) as missing:
        run_staged(read_missing, task, data_root=str(root), area=stager.area, inputs=inputs, cache=tmp_path / "node")
    assert str(root / "stage" / "absent") in str(missing.value) and str(tmp_path / "node") not in str(missing.value)


def test_published_outputs_never_leave_the_data_root(s3_env, tmp_path):
    """A node's list of what its task changed is applied under the data root only: a path climbing out of it, or an
    absolute one, is refused before anything is written."""
    s3_env.make_bucket("staging-escape")
    root = tmp_path / "data"
    root.mkdir()
    stager = DataRootStager(StagingArea("s3://staging-escape/run"), root)
    for outputs in (
        TaskFiles(files=(StagedFile(rel="../escaped.txt", digest="0" * 64, size=1, mtime_ns=0),)),
        TaskFiles(folders=("stage/../../out",)),
        TaskFiles(removed=(str(tmp_path / "victim"),)),
    ):
        with pytest.raises(ComputeError, match="outside the data root"):
            stager.publish(outputs)
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "out").exists()


class Span(NamedTuple):
    path: str
    start: int


def test_paths_are_moved_in_nested_tasks_and_only_under_the_root():
    words = WordTask(texts=Path("/data/t"), stem="/data/s", out="/tmp/o", spent=Path("/data/x"))
    task = {"a": ("/data/x", Path("/data/y/z")), "b": ["/database", "/data"], "c": frozenset({"/other"})}
    task |= {"d": Span("/data/part-0", 7), "e": functools.partial(count_words, words)}
    moved = rebased(task, "/data", "/node/t1")
    assert moved["e"].args == (
        WordTask(texts=Path("/node/t1/t"), stem="/node/t1/s", out="/tmp/o", spent=Path("/node/t1/x")),
    )
    assert {k: v for k, v in moved.items() if k != "e"} == {
        "a": ("/node/t1/x", Path("/node/t1/y/z")),
        "b": ["/database", "/node/t1"],
        "c": frozenset({"/other"}),
        "d": Span("/node/t1/part-0", 7),
    }
    assert task["c"] is moved["c"]  # what names nothing under the root is not copied
    assert named_paths(task, "/data") == {"/data/x", "/data/y/z", "/data", "/data/part-0", "/data/t", "/data/s"}


def test_a_staging_prefix_must_be_a_url_without_credentials():
    with pytest.raises(ConfigError, match="not a local path"):
        StagingArea("/mnt/shared/staging")
    with pytest.raises(ConfigError, match="credentials in the URL") as refused:
        StagingArea("s3://AKIAEXAMPLE:secret@bucket/prefix")
    assert "secret" not in str(refused.value)


def test_a_corrupt_or_missing_object_is_refused_and_leaves_no_partial(s3_env, tmp_path):
    s3_env.make_bucket("staging-corrupt")
    area = StagingArea("s3://staging-corrupt/run")
    (tmp_path / "f").write_bytes(b"right")
    digest = file_sha256(tmp_path / "f")
    s3_env.client().put_object(Bucket="staging-corrupt", Key=f"run/{OBJECTS}/{digest}", Body=b"wrong")
    with pytest.raises(ComputeError, match="not to its name"):
        area.get(digest, tmp_path / "g", Retries())
    with pytest.raises(ComputeError, match="no such object: the staging prefix was emptied"):
        area.get("0" * 64, tmp_path / "g", Retries())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


# the cluster: the whole graph with staging through the bucket, compared with the local engine


AUDIT_ROOT = "TOKENMILL_TEST_AUDIT_ROOT"  # the run's data root: no worker may touch a path under it
AUDIT_LOG = "TOKENMILL_TEST_AUDIT_LOG"
AUDIT_BYTES = 4096  # longer bytes arguments (marshalled code, pickles) are no paths


def audit_data_root() -> None:
    """Ray's worker setup hook: every audited operation (open, os.rename, os.remove, os.listdir, os.scandir,
    shutil.copyfile, ...) on a path under the run's data root is a line of the log; the first operation of each kind
    under this node's cache is too, which shows the hook runs in that worker."""
    root, log, cache = os.environ[AUDIT_ROOT], os.environ[AUDIT_LOG], os.environ.get(NODE_CACHE_VARIABLE, "")
    noted: set[str] = set()

    def hook(event: str, args: tuple) -> None:
        for arg in args:
            if isinstance(arg, bytes) and len(arg) > AUDIT_BYTES or not isinstance(arg, str | bytes | os.PathLike):
                continue
            path = os.fsdecode(arg)
            if path == root or path.startswith(root + "/"):
                line = f"{os.getpid()} {event} {path}"
            elif cache and path.startswith(cache + "/") and event not in noted:
                noted.add(event)
                line = f"{os.getpid()} cache {event} {path}"
            else:
                continue
            with open(log, "a", encoding="utf-8") as f:
                f.write(line + "\n")

    sys.addaudithook(hook)


def staged_run(address: str, nodes: list[str], source: Path, root: Path, staging: str, log: Path) -> dict:
    """In the driver: joins the cluster with the audit hook in every worker of this job, starts a worker on each
    node, runs the graph with staging; the steps' usage of every asset and the run's seconds."""
    import ray
    from ray import cloudpickle
    from test_ray import run_job, start_a_worker_on

    from resources import Compute
    from tokenmill.common.compute import RayEngine, RayOptions, activated
    from tokenmill.common.parallel import map_ordered

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray's workers cannot import this test module
    ray.init(
        address=address,
        logging_level=logging.WARNING,
        log_to_driver=False,
        runtime_env={
            "worker_process_setup_hook": audit_data_root,
            "env_vars": {AUDIT_ROOT: str(root), AUDIT_LOG: str(log)},
        },
    )
    start_a_worker_on(nodes)
    root.mkdir()
    with activated(RayEngine(RayOptions(address=address), str(root))):  # the control: a task that lists the data root
        assert list(map_ordered(os.listdir, [str(root)])) == [[]]
    start = time.perf_counter()
    result = run_job(source, root, Compute(engine="ray", ray_address=address, ray_staging=staging))
    seconds = time.perf_counter() - start
    usage = {
        event.asset_key.to_user_string(): event.materialization.metadata["step_seconds"].value
        for event in result.get_asset_materialization_events()
        if "step_seconds" in event.materialization.metadata
    }
    return {"success": result.success, "usage": usage, "seconds": seconds}


@pytest.fixture(scope="module")
def staging_cluster(s3, tmp_path_factory):
    """Two nodes, each with the S3 server's variables (as a node's own credentials) and a cache folder of its own."""
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster
    from test_ray import free_port

    caches = tmp_path_factory.mktemp("node-caches")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

    def node_env(name: str) -> dict[str, str]:
        return {**s3.env, NODE_CACHE_VARIABLE: str(caches / name)}

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"gcs_server_port": free_port(), "num_cpus": 1, "env_vars": node_env("head")},
    )
    try:
        second = cluster.add_node(num_cpus=1, env_vars=node_env("second"))
        yield cluster, [cluster.head_node.node_id, second.node_id], caches
    finally:
        cluster.shutdown()
        cluster.global_state.disconnect()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_nodes_without_a_shared_folder_write_the_local_engines_files(
    staging_cluster, s3_env, demo_source, tmp_path_factory
):
    from test_ray import driven, files, run_job, same_files

    from resources import Compute

    cluster, nodes, caches = staging_cluster
    local = tmp_path_factory.mktemp("local")
    assert run_job(demo_source, local, Compute(engine="local", workers=2)).success
    expected = files(local)

    s3_env.make_bucket("staging")
    root, log = tmp_path_factory.mktemp("staged") / "data", tmp_path_factory.mktemp("audit") / "audit.log"
    outcome = driven(staged_run, cluster.address, nodes, demo_source, root, "s3://staging/run", log)
    assert outcome["success"], outcome
    assert same_files(expected, root) == []

    lines = log.read_text().splitlines() if log.exists() else []
    touched = [line.split(" ", 1)[1] for line in lines if " cache " not in line]
    assert touched == [f"os.listdir {root}"]  # the control task's, and none by the staged run's workers
    hooked = {Path(line.split()[-1]).relative_to(caches).parts[0] for line in lines if " cache " in line}
    assert hooked == {"head", "second"}, lines  # ... and the hook ran in the tasks' workers on both nodes

    usage = outcome["usage"]
    encode = usage["tokenized_bins"]["tokenized_bins:encode_task"]
    assert encode["nodes"] == 2 and encode["staged_bytes_up"] > 0 and encode["staged_bytes_down"] > 0, encode
    steps = [step for asset in usage.values() for step in asset.values()]
    up, down = sum(s["staged_bytes_up"] for s in steps), sum(s["staged_bytes_down"] for s in steps)
    print(f"staged through the bucket: {up} bytes up, {down} bytes down; the run took {outcome['seconds']:.1f} s")
