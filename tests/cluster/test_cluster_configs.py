"""The cluster configs we ship are valid for the tools that read them, offline: the launcher config by
Ray's own schema (what `ray up` checks), the KubeRay manifests' pod templates by Kubernetes' schemas,
and the placement they promise holds together: every custom resource the answer job's pools ask for is
one some worker group provides."""

import copy
import json
import os
import shlex
import subprocess

import pytest
import yaml

from schemas.config import load_config
from strategies.registry import AnswerConfig
from tests.conftest import REPO

CLUSTER = REPO / "cluster"
KUBERNETES = "1.31.0"  # the newest schemas kubernetes-validate (pinned) carries
PLACEMENT = ["generator.resources={llm: 1}", "embedder.resources={retrieval: 1}", "retrieval.shard_resources={retrieval: 1}"]


def pools_ask_for(overrides: list[str]) -> set[str]:
    """The custom resources the answer job's pools ask for under ``overrides`` (validated as config)."""
    config = load_config(AnswerConfig, None, overrides)
    return {*config.generator.resources, *config.embedder.resources, *config.retrieval.shard_resources}


def test_the_launcher_config_passes_rays_own_validation_and_its_node_types_carry_the_placement_resources():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((CLUSTER / "aws.yaml").read_text())
    validate_config(prepare_config(copy.deepcopy(config)))  # what `ray up` does before it starts anything
    provided = {name for t in config["available_node_types"].values() for name in t["resources"]}
    assert pools_ask_for(PLACEMENT) <= provided
    broken = copy.deepcopy(config)
    broken["available_node_types"]["gpu_workers"]["min_worker"] = 1  # a typo the schema must catch
    with pytest.raises(Exception, match="min_worker"):
        validate_config(prepare_config(broken))


def kuberay_cluster_spec(name: str) -> dict:
    manifest = yaml.safe_load((CLUSTER / "kuberay" / name).read_text())
    assert manifest["apiVersion"] == "ray.io/v1"
    return manifest["spec"].get("rayClusterSpec", manifest["spec"])


def group_resources(group: dict) -> dict:
    """``rayStartParams.resources`` as KubeRay passes it to `ray start --resources=...`: a quoted JSON string."""
    value = group["rayStartParams"].get("resources")
    return json.loads(json.loads(value)) if value else {}


@pytest.mark.parametrize("name", ["raycluster.yaml", "rayjob.yaml"])
def test_kuberay_manifests_have_valid_pod_templates_and_groups_for_the_placement_they_use(name):
    from kubernetes_validate import validate

    spec = kuberay_cluster_spec(name)
    groups = spec["workerGroupSpecs"]
    for group in [spec["headGroupSpec"], *groups]:
        # KubeRay's CRD holds a plain pod template per group: Kubernetes' PodTemplate schema checks it
        validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "ragsift"},
                  "template": group["template"]}, KUBERNETES, strict=True)
        # the CRD types rayStartParams as map[string]string: a YAML number or mapping is refused at apply
        assert all(isinstance(v, str) for v in group["rayStartParams"].values()), group["rayStartParams"]
    submitter = yaml.safe_load((CLUSTER / "kuberay" / name).read_text())["spec"].get("submitterPodTemplate")
    if submitter:  # the RayJob's `ray job submit` pod
        validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "ragsift"}, "template": submitter},
                 KUBERNETES, strict=True)
    assert len({g["groupName"] for g in groups}) == len(groups)
    for g in groups:
        assert g.get("minReplicas", 0) <= g["replicas"] <= g.get("maxReplicas", g["replicas"])
    provided = {name for g in groups for name in group_resources(g)}
    assert pools_ask_for(PLACEMENT) <= provided


def ray_containers(name: str) -> list[dict]:
    """Every container of a KubeRay manifest's head and worker groups, and of its RayJob submitter pod."""
    manifest = yaml.safe_load((CLUSTER / "kuberay" / name).read_text())
    spec = kuberay_cluster_spec(name)
    templates = [g["template"] for g in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]]
    if manifest["kind"] == "RayJob":
        templates.append(manifest["spec"]["submitterPodTemplate"])  # KubeRay's default submitter carries no token
    return [c for t in templates for c in t["spec"]["containers"]]


@pytest.mark.parametrize("name", ["raycluster.yaml", "rayjob.yaml"])
def test_every_kuberay_container_runs_with_ray_token_auth_and_the_token_from_one_secret(name):
    """raycluster.yaml said "keep Ray token auth on" and no container set it: anyone reaching the head's
    dashboard (0.0.0.0) or GCS could run code in the cluster."""
    secrets = []
    for container in ray_containers(name):
        env = {e["name"]: e for e in container.get("env", [])}
        assert env.get("RAY_AUTH_MODE", {}).get("value") == "token", container["name"]
        secrets.append(env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"])  # never a value in the manifest
    assert len(secrets) >= 3 and all(s == {"name": "ragsift-ray-auth", "key": "auth_token"} for s in secrets)


def test_the_launcher_starts_every_node_with_ray_token_auth_and_gives_each_the_token():
    config = yaml.safe_load((CLUSTER / "aws.yaml").read_text())
    starts = [c for c in config["head_start_ray_commands"] + config["worker_start_ray_commands"] if " start " in f"{c} "]
    assert len(starts) == 2 and all(c.startswith("RAY_AUTH_MODE=token ") for c in starts), starts
    assert config["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"  # where `ray start` reads it on each node


def test_the_rayjob_entrypoint_is_a_valid_answer_command_whose_pools_fit_its_cluster():
    manifest = yaml.safe_load((CLUSTER / "kuberay" / "rayjob.yaml").read_text())
    argv = shlex.split(manifest["spec"]["entrypoint"])
    assert argv[:4] == ["python", "-m", "jobs.cli", "answer"]
    overrides = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    asked = pools_ask_for(overrides)  # every --set is a real config field with a valid value
    assert asked and asked <= {n for g in kuberay_cluster_spec("rayjob.yaml")["workerGroupSpecs"]
                               for n in group_resources(g)}


def test_the_rayjob_driver_can_read_the_index_it_names():
    """The entrypoint runs on the head and reads the index's manifest there: it was mounted on the cpu workers only."""
    manifest = yaml.safe_load((CLUSTER / "kuberay" / "rayjob.yaml").read_text())
    argv = shlex.split(manifest["spec"]["entrypoint"])
    index = argv[argv.index("--index-dir") + 1]
    head = kuberay_cluster_spec("rayjob.yaml")["headGroupSpec"]["template"]["spec"]
    assert any(m["mountPath"] == index for c in head["containers"] for m in c.get("volumeMounts", []))


def test_the_launcher_installs_the_pinned_gpu_stack():
    setup = " ".join(yaml.safe_load((CLUSTER / "aws.yaml").read_text())["setup_commands"])
    assert "-c constraints/gpu.txt" in setup
    assert "ragsift models prepare" in setup  # the default embedder is an offline alias, loaded on every node


def test_a_broken_pod_template_is_refused():
    """The check above can fail: a misspelt container field is caught."""
    from kubernetes_validate import validate
    from kubernetes_validate.utils import ValidationError

    template = copy.deepcopy(kuberay_cluster_spec("raycluster.yaml")["headGroupSpec"]["template"])
    template["spec"]["containers"][0]["imagee"] = "typo"
    with pytest.raises(ValidationError):
        validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "ragsift"}, "template": template},
                 KUBERNETES, strict=True)


def test_the_launcher_rsyncs_the_checkout_to_each_node_without_git_and_what_gitignore_leaves_out(tmp_path, monkeypatch):
    """`file_mounts: {"~/ragsift": "."}` copied the whole checkout, its .venv (GBs) and runs/ included, to every node.
    The command Ray's updater runs is recorded by a fake rsync (no node is reached)."""
    from ray.autoscaler._private.command_runner import SSHCommandRunner
    from ray.autoscaler._private.util import prepare_config

    config = prepare_config(yaml.safe_load((CLUSTER / "aws.yaml").read_text()))
    (tmp_path / "rsync").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path}/argv\n')
    (tmp_path / "rsync").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    runner = SSHCommandRunner(log_prefix="", node_id="n", provider=None, cluster_name="ragsift", process_runner=subprocess,
                              auth_config={"ssh_user": "ubuntu", "ssh_private_key": "/dev/null"}, use_internal_ip=True)
    monkeypatch.setattr(runner, "_get_ssh_target", lambda: "10.0.0.1")
    source = config["file_mounts"]["~/ragsift"]
    runner.run_rsync_up(f"{source}/", "~/ragsift/", options={k: config[k] for k in ("rsync_exclude", "rsync_filter")})
    argv = (tmp_path / "argv").read_text().splitlines()
    assert "dir-merge,- .gitignore" in given(argv, "--filter")  # .gitignore of every folder copied is rsync's filter there
    assert {"**/.git", "**/.git/**"} <= set(given(argv, "--exclude"))
    assert argv[-2:] == ["./", "ubuntu@10.0.0.1:~/ragsift/"]


def test_the_image_build_context_leaves_out_git_and_what_gitignore_leaves_out():
    """The image recipe (raycluster.yaml's header) is `COPY . /app` from the repo root: without a .dockerignore
    the image carried the checkout's .venv and runs/."""
    left_out = set(lines(REPO / ".dockerignore"))
    assert ".git" in left_out
    for pattern in lines(REPO / ".gitignore"):
        name = pattern.strip("/")
        # git's pattern without a leading / matches at any depth; Docker's matches at the root unless it starts with **/
        assert (name if pattern.startswith("/") else f"**/{name}") in left_out, pattern


def given(argv: list[str], flag: str) -> list[str]:
    """The values of ``flag`` in a command line."""
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def lines(path) -> list[str]:
    """An ignore file's patterns."""
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
