"""docs/cluster.md's commands, read from the page and run on a local three-node Ray cluster.

The `ray start` lines are parsed by Ray's own `ray start` command-line parser (so a flag
the page uses must exist and take what the page gives it), and their resources and labels
start the nodes of a ``ray.cluster_utils`` cluster on 127.0.0.1 (as tests/cluster/
test_multinode.py does; `ray start` itself would share the machine-wide `ray stop` with
other users of this machine). Then the page's `rollart train` runs two steps against it,
and its `rollart status` shows, while the run is going, each role on the pool the page's
table says.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "cluster.md"
LOCAL = {"$HEAD_IP": "127.0.0.1", "$NODE_IP": "127.0.0.1"}


def doc_commands() -> list[str]:
    """Every command in the page's ```bash blocks, in order."""
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), re.S)
    return [line.strip() for b in blocks for line in b.splitlines()
            if line.strip() and not line.startswith("#")]


def local(cmd: str) -> str:
    for var, value in LOCAL.items():
        cmd = cmd.replace(var, value)
    return cmd


def ray_start_args(cmd: str) -> dict:
    """The options of one `ray start` line, as Ray's own parser reads them."""
    from ray.scripts.scripts import start

    words = shlex.split(local(cmd))
    assert words[:2] == ["ray", "start"], cmd
    ctx = start.make_context("start", words[2:])
    return ctx.params


def test_the_page_has_the_commands():
    cmds = doc_commands()
    starts = [c for c in cmds if c.startswith("ray start")]
    assert len(starts) == 3 and "--head" in starts[0]
    assert any(c.startswith("rollart train examples/cluster.yaml --address=") for c in cmds)
    assert any(c.startswith("rollart status --address=") for c in cmds)


def _node_args(params: dict) -> dict:
    from ray._private.label_utils import parse_node_labels_string

    return dict(num_cpus=1, resources=json.loads(params["resources"]),
                labels=parse_node_labels_string(params["labels"]),
                node_ip_address=params["node_ip_address"])


@pytest.fixture(scope="module")
def doc_cluster():
    """The page's nodes on a local ray.cluster_utils cluster; yields (cluster, label of node)."""
    from ray.cluster_utils import Cluster as RayCluster

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    starts = [ray_start_args(c) for c in doc_commands() if c.startswith("ray start")]
    head, workers = starts[0], starts[1:]
    assert head["head"] and head["port"] == 6379
    assert all(w["address"] == "127.0.0.1:6379" for w in workers)
    head_args = _node_args(head)
    c = RayCluster(initialize_head=True,
                   head_node_args=dict(head_args, include_dashboard=False))
    nodes = {c.head_node.node_id: head_args["labels"]["hardware"]}
    for w in workers:
        args = _node_args(w)
        nodes[c.add_node(**args).node_id] = args["labels"]["hardware"]
    try:
        c.wait_for_nodes(timeout=120)
        yield c, nodes
    finally:
        c.shutdown()


def _doc_command(prefix: str, address: str) -> list[str]:
    cmd = next(c for c in doc_commands() if c.startswith(prefix))
    words = shlex.split(local(cmd).replace("127.0.0.1:6379", address))
    assert words[0] == "rollart"
    return [sys.executable, "-m", "rollart_sdk.cli", *words[1:]]


def _bindings(address: str) -> list[dict]:
    p = subprocess.run(_doc_command("rollart status", address) + ["--json", "--timeout", "60"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    if p.returncode != 0:
        return []
    return json.loads(p.stdout)["bindings"]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_documented_train_and_status_on_a_local_cluster(doc_cluster, tmp_path):
    cluster, label_of = doc_cluster
    train = _doc_command("rollart train", cluster.address) + [
        "--steps", "2", "--no-progress", f"output_dir={tmp_path}"]
    env = {**os.environ, "ROLLART_WORKER_START_TIMEOUT_S": "900"}
    env.pop("RAY_ADDRESS", None)
    log = (tmp_path / "train.log").open("w")
    proc = subprocess.Popen(train, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        seen: list[dict] = []
        deadline = time.monotonic() + 900
        while proc.poll() is None and time.monotonic() < deadline:
            got = _bindings(cluster.address)
            if len(got) > len(seen):
                seen = got
            if {b["role"] for b in seen} >= {"actor_train", "actor_gen", "environment"}:
                break
            time.sleep(3)
        rc = proc.wait(timeout=max(60, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    out = (tmp_path / "train.log").read_text()
    assert rc == 0, out[-4000:]
    pools = {}
    for b in seen:
        assert label_of[b["node_id"]] == b["pool"] == b["hardware"], b  # the node of its pool
        pools.setdefault(b["role"], set()).add(b["pool"])
    # the page's table: trainer on H800, one engine on H800 and one on H20, the env host on
    # cpu, the rule reward in process (no reward worker)
    assert pools == {"actor_train": {"H800"}, "actor_gen": {"H800", "H20"},
                     "environment": {"cpu"}}, seen
    assert not any(b["fallback"] for b in seen), seen
    run = next(tmp_path.glob("cluster-*"))
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
