"""``multigpu k8s``: TrainJob / PyTorchJob manifests that pass the operators' published schemas."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from multigpu.cli.main import main
from multigpu.launch.kubernetes import K8sJob, manifests
from tests.k8s.schemas import errors

pytest.importorskip("jsonschema", reason="the schema checks need jsonschema (the dev extra)")

IMG = "registry.example/team/train:1"


def k8s(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["k8s", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


def test_trainjob_of_the_issue_passes_the_schema(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = k8s(capsys, "examples/minimal.py", "--nodes", "2", "--gpus-per-node", "8",
                         "--image", IMG, "--pvc", "ckpt", "--namespace", "team-a")  # fmt: skip
    assert code == 0, err
    job, policy = documents(out)
    assert [errors(job), errors(policy)] == [[], []]
    assert job["kind"] == "TrainJob" and job["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
    assert job["spec"]["runtimeRef"]["name"] == "torch-distributed"
    trainer = job["spec"]["trainer"]
    assert trainer["numNodes"] == 2 and trainer["numProcPerNode"] == 8
    assert trainer["resourcesPerNode"] == {"limits": {"nvidia.com/gpu": 8}}
    # The pods run multigpu run, which reads the runtime's PET_* variables: no topology here,
    # and none of the runtime's reserved variables (its webhook refuses them in trainer.env).
    assert trainer["command"] == ["multigpu", "run", "examples/minimal.py"]
    assert not any(name.startswith("PET_") for name in env_of(trainer))
    assert job["metadata"]["namespace"] == policy["metadata"]["namespace"] == "team-a"
    # Where checkpoints go: in the first comment, the annotation and the mounted claim.
    assert out.splitlines()[0].startswith("# checkpoints: write them under /checkpoints (")
    assert job["metadata"]["annotations"] == {"multigpu/checkpoints": "/checkpoints"}
    (patch,) = job["spec"]["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = node["template"]["spec"]["template"]["spec"]
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "ckpt"}} in pod["volumes"]
    assert {"name": "checkpoints", "mountPath": "/checkpoints"} in pod["containers"][0][
        "volumeMounts"
    ]


def test_network_policy_admits_the_jobs_own_pods_only(capsys: pytest.CaptureFixture[str]) -> None:
    for kind, label in (("trainjob", "jobset.sigs.k8s.io/jobset-name"),
                        ("pytorchjob", "training.kubeflow.org/job-name")):  # fmt: skip
        code, out, err = k8s(capsys, "t.py", "--nodes", "2", "--image", IMG, "--kind", kind,
                             "--name", "job7")  # fmt: skip
        assert code == 0, err
        policy = documents(out)[1]
        assert errors(policy) == []
        own = {"matchLabels": {label: "job7"}}
        assert policy["spec"] == {
            "podSelector": own,  # the policy covers the job's pods ...
            "policyTypes": ["Ingress"],  # ... whose only way in is from the job's pods
            "ingress": [{"from": [{"podSelector": own}]}],
        }


def test_pytorchjob_master_and_workers(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = k8s(capsys, "t.py", "--lr", "0.1", "--kind", "pytorchjob", "--nodes", "3",
                         "--cpu", "2", "--cpus-per-node", "4", "--memory", "8Gi", "--image", IMG,
                         "--max-restarts", "2", "--timeout", "60", "--pvc", "ckpt",
                         "--mount", "/ckpt")  # fmt: skip
    assert code == 0, err
    job, policy = documents(out)
    assert [errors(job), errors(policy)] == [[], []]
    assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "PyTorchJob"
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert {k: v["replicas"] for k, v in specs.items()} == {"Master": 1, "Worker": 2}
    assert job["spec"]["nprocPerNode"] == "2" and "elasticPolicy" not in job["spec"]
    (container,) = specs["Worker"]["template"]["spec"]["containers"]
    assert container["name"] == "pytorch"  # the operator sets the variables in this one
    assert container["ports"] == [{"name": "pytorchjob-port", "containerPort": 23456}]
    assert container["command"] == ["multigpu", "run", "--max-restarts", "2", "--timeout", "60",
                                    "t.py", "--lr", "0.1"]  # fmt: skip
    resources = {"cpu": "4", "memory": "8Gi"}
    assert container["resources"] == {"limits": resources, "requests": resources}
    for role in ("Master", "Worker"):  # the claim in every pod, where the annotation says
        pod = specs[role]["template"]["spec"]
        assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "ckpt"}} in pod[
            "volumes"
        ]
        assert {"name": "checkpoints", "mountPath": "/ckpt"} in pod["containers"][0]["volumeMounts"]
    assert job["metadata"]["annotations"] == {"multigpu/checkpoints": "/ckpt"}


def test_elastic_pytorchjob_has_an_elastic_policy(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = k8s(capsys, "--kind", "pytorchjob", "--nnodes", "1:4", "--image", IMG,
                         "--max-restarts", "3", "t.py")  # fmt: skip
    assert code == 0, err
    job = documents(out)[0]
    assert errors(job) == []
    assert job["spec"]["elasticPolicy"] == {
        "rdzvBackend": "c10d", "rdzvId": "t", "minReplicas": 1, "maxReplicas": 4, "maxRestarts": 3
    }  # fmt: skip
    assert list(job["spec"]["pytorchReplicaSpecs"]) == ["Worker"]
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 4
    # Restarts are the operator's PET_MAX_RESTARTS here, not a second, contradicting option.
    container = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["multigpu", "run", "t.py"]


def test_the_schema_check_catches_what_a_cluster_refuses() -> None:
    job = manifests(K8sJob(script="t.py", image=IMG, name="t", nodes=2))[0]
    job["spec"]["trainer"]["numNodes"] = "2"  # a string where the CRD has an integer
    job["spec"]["trainer"]["numNode"] = 2  # a misspelt field (refused by --validate=strict)
    job["metadata"]["name"] = "7-train"  # not an RFC 1035 label (the CRD's CEL rule)
    found = errors(job)
    assert any("metadata/name" in e for e in found), found
    assert any("spec/trainer/numNodes" in e for e in found), found
    assert any("numNode" in e and "unexpected" in e for e in found), found


def test_script_arguments_after_double_dash_and_anywhere(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = k8s(capsys, "t.py", "--epochs", "3", "--nodes", "2", "--image", IMG, "--",
                       "--out", "/checkpoints/run1", "--nodes", "9")  # fmt: skip
    assert code == 0
    command = documents(out)[0]["spec"]["trainer"]["command"]
    assert command == ["multigpu", "run", "t.py", "--epochs", "3", "--out", "/checkpoints/run1",
                       "--nodes", "9"]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--nodes", "2", "t.py"], "the following arguments are required: --image"),
        (["--image", IMG, "t.py"], "no node count was given; expected --nodes N"),
        (["--nodes", "0", "--image", IMG, "t.py"], "'0' is not valid; expected a whole number"),
        (["--nnodes", "1:2", "--image", IMG, "t.py"], "expected --kind pytorchjob with it"),
        (["--nodes", "2", "--image", IMG, "--name", "Bad_Name", "t.py"], "is not a job name"),
        (["--nodes", "2", "--image", IMG, "--pvc", "a b", "t.py"], "is not a PersistentVolume"),
        (["--nodes", "2", "--image", IMG, "--mount", "rel", "t.py"], "expected an absolute path"),
        (
            ["--nodes", "2", "--gpus-per-node", "8", "--cpu", "2", "--image", IMG, "t.py"],
            "expected one of them",
        ),
        (["--nodes", "2", "--image", IMG, "--kind", "job", "t.py"], "invalid choice: 'job'"),
    ],
)
def test_bad_input_is_one_line_exit_2_nothing_written(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], said: str
) -> None:
    out_file = tmp_path / "job.yaml"
    code, out, err = k8s(capsys, *argv, "--out", str(out_file))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("multigpu: error: "), err
    assert said in err, err
    assert not out_file.exists() and list(tmp_path.iterdir()) == []


def test_out_writes_the_file_and_refuses_to_overwrite(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out_file = tmp_path / "job.yaml"
    argv = ["t.py", "--nodes", "2", "--image", IMG, "--out", str(out_file)]
    code, out, _ = k8s(capsys, *argv)
    assert code == 0 and out.startswith(f"wrote {out_file}")
    first = out_file.read_text()
    assert [d["kind"] for d in documents(first)] == ["TrainJob", "NetworkPolicy"]
    code, _, err = k8s(capsys, *argv, "--nodes", "3")
    assert code == 2 and "exists" in err and out_file.read_text() == first
    assert k8s(capsys, *argv, "--nodes", "3", "--force")[0] == 0
    assert documents(out_file.read_text())[0]["spec"]["trainer"]["numNodes"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.yaml"]  # no temporary left


def test_yaml_round_trips_the_awkward_values() -> None:
    from multigpu.launch.kubernetes import to_yaml

    awkward = ["", "yes", "No", "null", "~", "1:2", "0x10", "1e3", "--out", "a: b", "# x", "- y",
               "it's", 'say "hi"', "line\nbreak", "tab\there", "é ü", "{a}", "[1]", "*ref", "&a",
               "!tag", "%p", "@at", "`tick`", "x #y", "trailing ", " leading", "3"]  # fmt: skip
    doc = {"args": awkward, "env": [{"name": v, "value": v} for v in awkward], "n": 3, "f": 0.5,
           "b": True, "empty": {}, "none": []}  # fmt: skip
    assert yaml.safe_load(to_yaml([doc], ["a comment"])) == doc
