"""The Helm chart helm/memory-proxy: strict lint, offline render, Kubernetes schema
validation of every manifest, and the wiring the gateway depends on.

Helm v4 runs embedded (helm-python-sdk), manifests are checked against Kubernetes'
OpenAPI schemas (kubernetes-validate); no cluster, no network.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy.settings import load_settings

helm = pytest.importorskip("helm_python", reason="install the test extra (helm-python-sdk)")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

CHART = Path(__file__).resolve().parent.parent / "helm" / "memory-proxy"
EXAMPLES = sorted((CHART / "values-examples").glob("*.yaml"))
KUBERNETES_VERSION = "1.33.0"
CUSTOM_KINDS = {"ServiceMonitor"}  # CRDs: no built-in schema to validate against
CONFIG_PATH = "/etc/memory-proxy/config.yaml"


# No image is published, so image.repository has no default: every install names the one
# its operator built and pushed, as these tests do.
IMAGE_REPOSITORY = "registry.example.com/memory-proxy"
README_STEPS = 'README.md, Deploy, "Build and push the image"'


def with_image(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with image.repository set (as every install must)."""
    image = {"repository": IMAGE_REPOSITORY, **values.get("image", {})}
    return {**values, "image": image}


def values_of(path: Path | None) -> dict[str, Any]:
    return with_image(yaml.safe_load(path.read_text()) if path else {})


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    rendered = helm.Chart.load(str(CHART)).render(values=with_image(values), name="mp",
                                                  namespace="memory")
    docs = []
    for name, text in rendered.items():
        if name.endswith(".yaml"):
            docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def container(workload: dict[str, Any]) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


VARIANTS = [pytest.param(None, id="default"), *(pytest.param(p, id=p.stem) for p in EXAMPLES)]


@pytest.mark.parametrize("values_file", VARIANTS)
def test_lint_is_clean_in_strict_mode(values_file: Path | None) -> None:
    """helm lint --strict reports nothing for the default values and each example."""
    report = helm.lint(str(CHART), values_of(values_file), strict=True)
    assert report["errors"] == []
    assert report["messages"] == []


@pytest.mark.parametrize("values_file", VARIANTS)
def test_every_built_in_manifest_is_valid_kubernetes(values_file: Path | None) -> None:
    """Each rendered manifest of a built-in kind passes Kubernetes' schema (strict: no
    unknown fields); only CRDs (ServiceMonitor) are skipped, by name."""
    docs = render(values_of(values_file))
    checked = 0
    for doc in docs:
        if doc["kind"] in CUSTOM_KINDS:
            assert doc["apiVersion"] == "monitoring.coreos.com/v1"
            continue
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        checked += 1
    assert checked >= 4


def test_the_schema_refuses_bad_values() -> None:
    """values.schema.json rejects an unknown storage backend, a Redis older than 8 and a
    config that sets storage.url itself; lint reports them."""
    chart = helm.Chart.load(str(CHART))
    for wrong in ({"storage": {"backend": "postgres"}},
                  {"redis": {"enabled": True, "image": {"tag": "7.4"}}},
                  {"config": {"storage": {"url": "redis://x"}}}):
        bad = with_image(wrong)
        with pytest.raises(helm.HelmValuesError):
            chart.validate_schema(chart.merge_values(bad))
        assert helm.lint(str(CHART), bad, strict=True)["messages"]


def test_the_image_repository_is_required_and_points_at_the_build_steps() -> None:
    """No image is published: image.repository defaults to empty, and installing without
    it fails (schema, lint and render) with a message naming the README's "Build and push
    the image" steps; the repository given becomes the workloads' image."""
    assert yaml.safe_load((CHART / "values.yaml").read_text())["image"]["repository"] == ""
    chart = helm.Chart.load(str(CHART))
    with pytest.raises(helm.HelmValuesError, match=r"image\.repository is empty") as refused:
        chart.validate_schema(chart.merge_values({}))
    assert README_STEPS in str(refused.value)
    with pytest.raises(helm.HelmValuesError, match="Build and push the image"):
        chart.render(values={}, name="mp", namespace="memory")
    report = helm.lint(str(CHART), {}, strict=True)
    assert any(README_STEPS in m["error"] for m in report["messages"])
    gateway = container(by_kind(render({}), "Deployment")["mp-memory-proxy-gateway"])
    assert gateway["image"].startswith(IMAGE_REPOSITORY + ":")


def test_default_install_is_redis_mode_with_a_bundled_redis_8() -> None:
    """Defaults: gateway and worker Deployments, both HPAs, PDBs, and a bundled Redis 8
    StatefulSet with AOF, noeviction and a PVC; the gateway runs without the in-process
    worker and reaches that Redis."""
    docs = render({})
    deployments = by_kind(docs, "Deployment")
    assert set(deployments) == {"mp-memory-proxy-gateway", "mp-memory-proxy-worker"}
    assert set(by_kind(docs, "HorizontalPodAutoscaler")) == set(deployments)
    assert set(by_kind(docs, "PodDisruptionBudget")) == set(deployments)
    gateway = container(deployments["mp-memory-proxy-gateway"])
    assert gateway["args"][0] == "serve"
    assert "--no-worker" in gateway["args"]
    worker = container(deployments["mp-memory-proxy-worker"])
    assert worker["args"] == ["worker", "--metrics-port", "9464"]
    assert worker["ports"] == [{"name": "metrics", "containerPort": 9464, "protocol": "TCP"}]
    metrics = by_kind(docs, "Service")["mp-memory-proxy-worker-metrics"]
    assert metrics["spec"]["ports"][0]["targetPort"] == "metrics"
    redis = by_kind(docs, "StatefulSet")["mp-memory-proxy-redis"]
    rc = container(redis)
    assert rc["image"] == "redis:8.2"
    args = " ".join(rc["args"])
    assert "--appendonly yes" in args
    assert "--maxmemory-policy noeviction" in args
    assert redis["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "redis-data"
    assert by_kind(docs, "Service")["mp-memory-proxy-redis"]["spec"]["ports"][0]["port"] == 6379
    assert env_of(gateway)["REDIS_URL"] == "redis://mp-memory-proxy-redis:6379/0"


def test_gateway_hpa_scales_down_slowly_for_streams() -> None:
    """The gateway HPA removes at most one pod per period after a long stabilization."""
    hpa = by_kind(render({}), "HorizontalPodAutoscaler")["mp-memory-proxy-gateway"]
    down = hpa["spec"]["behavior"]["scaleDown"]
    assert down["stabilizationWindowSeconds"] >= 300
    assert down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 300}]


def test_sqlite_mode_is_one_statefulset_with_learning_in_process() -> None:
    """storage.backend: sqlite renders one StatefulSet replica with a data PVC, the worker
    in the gateway process, and no worker, HPA, PDB or Redis."""
    docs = render({"storage": {"backend": "sqlite"}})
    assert by_kind(docs, "Deployment") == {}
    assert by_kind(docs, "HorizontalPodAutoscaler") == {}
    assert by_kind(docs, "PodDisruptionBudget") == {}
    (name, sts), = by_kind(docs, "StatefulSet").items()
    assert name == "mp-memory-proxy-gateway"
    assert sts["spec"]["replicas"] == 1
    c = container(sts)
    assert "--no-worker" not in c["args"]
    assert {"name": "data", "mountPath": "/data"} in c["volumeMounts"]
    assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"


@pytest.mark.parametrize("backend", ["redis", "sqlite"])
def test_mode_and_config_backend_come_from_one_value(backend: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The rendered config.yaml's storage.backend, the container's environment and the
    chart's shape all follow storage.backend — even when config says otherwise — and the
    gateway accepts the rendered config."""
    docs = render({"storage": {"backend": backend},
                   "config": {"storage": {"backend": "sqlite" if backend == "redis"
                                          else "redis"}}})
    config_text = by_kind(docs, "ConfigMap")["mp-memory-proxy-config"]["data"]["config.yaml"]
    config = yaml.safe_load(config_text)
    assert config["storage"]["backend"] == backend
    gateway = container(by_kind(docs, "Deployment" if backend == "redis" else "StatefulSet")[
        "mp-memory-proxy-gateway"])
    env = env_of(gateway)
    assert env["MEMORY_PROXY_STORAGE__BACKEND"] == backend
    # The gateway reads that file as the container would (env from the manifest).
    monkeypatch.chdir(CHART)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("FINGERPRINT_KEY", "f" * 64)  # what the fingerprint Secret holds
    for name, value in env.items():
        if isinstance(value, str):
            monkeypatch.setenv(name, value)
    config_file = tmp_path / "config.yaml"
    config_file.write_text(config_text)
    settings = load_settings(config_file)
    assert settings.storage.backend == backend
    assert settings.server.host == "0.0.0.0"  # noqa: S104 - the pod listens on all
    if backend == "redis":
        assert settings.storage.url is not None
        assert settings.storage.url.get_secret_value() == env["REDIS_URL"]
        assert settings.learning.fingerprint_key is not None
    else:
        assert str(settings.storage.path) == "/data/memory-proxy.db"


@pytest.mark.parametrize("values_file", VARIANTS)
def test_config_is_mounted_where_the_gateway_reads_it(values_file: Path | None) -> None:
    """Every memory-proxy container mounts the ConfigMap's config.yaml at the path
    MEMORY_PROXY_CONFIG names (the one the image sets too)."""
    docs = render(values_of(values_file))
    configmaps = by_kind(docs, "ConfigMap")
    workloads = [w for w in [*by_kind(docs, "Deployment").values(),
                             *by_kind(docs, "StatefulSet").values()]
                 if w["metadata"]["labels"]["app.kubernetes.io/component"] != "redis"]
    assert workloads
    for workload in workloads:
        c = container(workload)
        assert env_of(c)["MEMORY_PROXY_CONFIG"] == CONFIG_PATH
        mount = next(m for m in c["volumeMounts"] if m["name"] == "config")
        volume = next(v for v in workload["spec"]["template"]["spec"]["volumes"]
                      if v["name"] == "config")
        item = volume["configMap"]["items"][0]
        assert f"{mount['mountPath']}/{item['path']}" == CONFIG_PATH
        assert "config.yaml" in configmaps[volume["configMap"]["name"]]["data"]
    dockerfile = (CHART.parent.parent / "Dockerfile").read_text()
    assert f"MEMORY_PROXY_CONFIG={CONFIG_PATH}" in dockerfile


def test_existing_configmap_replaces_the_rendered_one() -> None:
    """existingConfigMap: no ConfigMap is rendered and the pods mount the named one."""
    docs = render({"existingConfigMap": "my-config"})
    assert by_kind(docs, "ConfigMap") == {}
    volume = next(v for v in by_kind(docs, "Deployment")["mp-memory-proxy-gateway"]["spec"][
        "template"]["spec"]["volumes"] if v["name"] == "config")
    assert volume["configMap"]["name"] == "my-config"


@pytest.mark.parametrize("values_file", VARIANTS)
def test_secrets_are_referenced_never_inlined(values_file: Path | None) -> None:
    """No Secret is rendered from values (the only one is the generated fingerprint key,
    random, in Redis mode without fingerprintKey.existingSecret); the Redis URL of an
    external Redis and the API keys come from secretKeyRef / envFrom secretRef; the
    config holds only os.environ/ references."""
    values = values_of(values_file)
    docs = render(values)
    assert set(by_kind(docs, "Secret")) <= {"mp-memory-proxy-fingerprint"}
    config = by_kind(docs, "ConfigMap")["mp-memory-proxy-config"]["data"]["config.yaml"]
    assert "sk-" not in config
    for deployment in by_kind(docs, "Deployment").values():
        c = container(deployment)
        if values.get("existingSecret"):
            assert {"secretRef": {"name": values["existingSecret"]}} in c["envFrom"]
        if values.get("redis", {}).get("enabled") is False:
            assert env_of(c)["REDIS_URL"] == {"secretKeyRef": {
                "name": values["externalRedis"]["existingSecret"], "key": "redis-url"}}


def test_external_redis_without_a_secret_is_refused() -> None:
    """redis.enabled: false without externalRedis.existingSecret fails to render, naming
    the value to set."""
    with pytest.raises(helm.HelmRenderError, match=r"externalRedis\.existingSecret"):
        render({"redis": {"enabled": False}})


@pytest.mark.parametrize("values_file", VARIANTS)
def test_probes_shutdown_and_security_context(values_file: Path | None) -> None:
    """Gateway probes: liveness and startup on /healthz, readiness on /readyz; a preStop
    sleep and a termination grace of preStop + shutdown grace + 10 s, with the shutdown
    grace passed to the gateway; non-root, no privilege escalation, all capabilities
    dropped, read-only root filesystem."""
    values = values_of(values_file)
    docs = render(values)
    gateway_workload = {**by_kind(docs, "Deployment"), **by_kind(docs, "StatefulSet")}[
        "mp-memory-proxy-gateway"]
    pod = gateway_workload["spec"]["template"]["spec"]
    c = container(gateway_workload)
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    grace = values.get("gateway", {}).get("shutdownGraceSeconds", 120)
    pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pod["terminationGracePeriodSeconds"] == pre_stop + grace + 10
    config = yaml.safe_load(by_kind(docs, "ConfigMap")["mp-memory-proxy-config"]["data"][
        "config.yaml"])
    assert config["server"]["shutdown_grace_seconds"] == grace
    assert env_of(c)["MEMORY_PROXY_SERVER__SHUTDOWN_GRACE_SECONDS"] == str(grace)
    for workload in [*by_kind(docs, "Deployment").values(), *by_kind(docs, "StatefulSet")
                     .values()]:
        spec = workload["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        sc = container(workload)["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert sc["readOnlyRootFilesystem"] is True
        assert spec["automountServiceAccountToken"] is False


def test_external_redis_example_runs_three_gateways_and_two_workers() -> None:
    """The external-Redis example: fixed 3 gateways and 2 workers (no HPA), no bundled
    Redis, a ServiceMonitor on /metrics, a NetworkPolicy and an Ingress."""
    docs = render(values_of(CHART / "values-examples" / "external-redis.yaml"))
    deployments = by_kind(docs, "Deployment")
    assert deployments["mp-memory-proxy-gateway"]["spec"]["replicas"] == 3
    assert deployments["mp-memory-proxy-worker"]["spec"]["replicas"] == 2
    assert by_kind(docs, "HorizontalPodAutoscaler") == {}
    assert by_kind(docs, "StatefulSet") == {}
    monitor, = by_kind(docs, "ServiceMonitor").values()
    assert [(e["port"], e["path"]) for e in monitor["spec"]["endpoints"]] == [
        ("http", "/metrics"), ("metrics", "/metrics")]
    assert by_kind(docs, "NetworkPolicy")
    assert by_kind(docs, "Ingress")


def test_no_worker_when_learning_is_off() -> None:
    """config.learning.enabled false (the worker would exit at once): no worker
    Deployment, HPA, PDB or metrics Service; the gateways are unchanged."""
    docs = render({"config": {"learning": {"enabled": False}}})
    assert set(by_kind(docs, "Deployment")) == {"mp-memory-proxy-gateway"}
    assert set(by_kind(docs, "HorizontalPodAutoscaler")) == {"mp-memory-proxy-gateway"}
    assert set(by_kind(docs, "PodDisruptionBudget")) == {"mp-memory-proxy-gateway"}
    assert "mp-memory-proxy-worker-metrics" not in by_kind(docs, "Service")


def test_redis_mode_keys_fingerprints_with_a_secret() -> None:
    """Redis mode: gateway and worker read learning.fingerprint_key from a Secret — the
    generated one (a random 64-character key), or fingerprintKey.existingSecret (then
    none is generated); SQLite mode renders none (the key file lives next to the
    database)."""
    import base64

    for values, secret in (({}, "mp-memory-proxy-fingerprint"),
                           ({"fingerprintKey": {"existingSecret": "mine"}}, "mine")):
        docs = render(values)
        generated = by_kind(docs, "Secret")
        assert set(generated) == ({secret} if secret != "mine" else set())
        if generated:
            key = base64.b64decode(generated[secret]["data"]["fingerprint-key"])
            assert len(key) == 64
        for workload in (*by_kind(docs, "Deployment").values(),):
            env = env_of(container(workload))
            assert env["MEMORY_PROXY_LEARNING__FINGERPRINT_KEY"] == "os.environ/FINGERPRINT_KEY"
            assert env["FINGERPRINT_KEY"] == {"secretKeyRef": {"name": secret,
                                                               "key": "fingerprint-key"}}
    sqlite = render({"storage": {"backend": "sqlite"}})
    assert by_kind(sqlite, "Secret") == {}
    for workload in by_kind(sqlite, "StatefulSet").values():
        assert "FINGERPRINT_KEY" not in env_of(container(workload))
