"""Cluster definitions validate the way their tools would: Ray's config schema, KubeRay's CRDs."""

from __future__ import annotations

import functools
import gzip
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.conftest import REPO

CRDS = REPO.parent / "shared" / "data" / "kuberay-crds"
KUBERAY = sorted((REPO / "infra" / "kuberay").glob("*.yaml"))
CRD_FILES = {"RayCluster": "ray.io_rayclusters.yaml.gz", "RayJob": "ray.io_rayjobs.yaml.gz",
             "RayCronJob": "ray.io_raycronjobs.yaml.gz"}


@functools.cache
def _crd_schema(kind: str) -> dict:
    """The CRD's v1 schema, parsed once per run (libyaml's loader where PyYAML has it: the CRDs are
    megabytes of YAML)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd = yaml.load(gzip.open(CRDS / CRD_FILES[kind]).read(), Loader=loader)  # noqa: S506 - a safe loader
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema: dict = version["schema"]["openAPIV3Schema"]
    return schema


def _validate(doc: dict, kind: str) -> None:
    """``jsonschema.validate`` without re-checking the (large, fixed) schema against its metaschema
    on every call: checked once per kind."""
    schema = _crd_schema(kind)
    cls = jsonschema.validators.validator_for(schema)
    _checked(kind, cls)
    cls(schema).validate(doc)


@functools.cache
def _checked(kind: str, cls: type) -> None:
    cls.check_schema(_crd_schema(kind))


def test_ray_cluster_launcher_config_passes_rays_validation() -> None:
    from ray.autoscaler._private.util import validate_config

    config = yaml.safe_load((REPO / "infra" / "ray" / "cluster.yaml").read_text())
    validate_config(config)
    assert config["available_node_types"]["gpu-h200"]["resources"]["GPU"] == 1


@pytest.mark.parametrize("path", KUBERAY, ids=[p.name for p in KUBERAY])
def test_kuberay_manifest_is_one_valid_resource(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert len(docs) == 1, "one resource per file"
    doc = docs[0]
    assert {"apiVersion", "kind", "metadata"} <= set(doc)
    if doc["kind"] in CRD_FILES:
        if not CRDS.is_dir():
            pytest.skip(f"KubeRay CRDs not found at {CRDS}")
        _validate(doc, doc["kind"])


def test_crd_validation_rejects_a_broken_manifest() -> None:
    if not CRDS.is_dir():
        pytest.skip(f"KubeRay CRDs not found at {CRDS}")
    doc = yaml.safe_load((REPO / "infra" / "kuberay" / "raycluster.yaml").read_text())
    del doc["spec"]["workerGroupSpecs"][0]["groupName"]
    with pytest.raises(jsonschema.ValidationError, match="groupName"):
        _validate(doc, "RayCluster")


def test_nightly_definitions_agree() -> None:
    cron = yaml.safe_load((REPO / "infra" / "kuberay" / "raycronjob-nightly.yaml").read_text())
    job = yaml.safe_load((REPO / "infra" / "kuberay" / "rayjob-nightly.yaml").read_text())
    assert job["spec"] == cron["spec"]["jobTemplate"]
    assert "swapcheck nightly" in job["spec"]["entrypoint"]
