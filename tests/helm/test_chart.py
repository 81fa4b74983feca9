"""The Helm chart, checked with the real helm binary (v4) and Kubernetes' OpenAPI schemas.

Every values set (defaults + helm/ragkv/examples/*.yaml) must pass `helm lint --strict`,
render with `helm template`, and validate strictly with kubernetes-validate. The
operator CRDs (KubeRay's RayCluster, Prometheus' ServiceMonitor) have no schema in
kubernetes-validate: their embedded pod templates are validated as core PodTemplates
and the rest is asserted field by field below. Anything else unknown fails.
"""

from __future__ import annotations

import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

kubernetes_validate = pytest.importorskip("kubernetes_validate")

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "ragkv"
EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))
BAD_VALUES = Path(__file__).parent / "values"
HELM = Path(sys.executable).parent / "helm"

if not HELM.is_file():
    pytest.skip(f"helm binary missing at {HELM}: run `make setup` (python -m ragkv.tools.install_helm)",
                allow_module_level=True)

# Oldest Kubernetes the chart supports with native gRPC probes GA, and the newest schema installed.
K8S_VERSIONS = ("1.31.0", kubernetes_validate.utils.latest_version())
CRD_KINDS = {("ray.io/v1", "RayCluster"), ("monitoring.coreos.com/v1", "ServiceMonitor")}
CASES = ["default", *(p.stem for p in EXAMPLES)]


def helm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=60)


def values_args(case: str) -> list[str]:
    return [] if case == "default" else ["-f", str(CHART / "examples" / f"{case}.yaml")]


@lru_cache(maxsize=None)
def render(case: str = "default", *sets: str) -> tuple[dict, ...]:
    args = ["template", "rel", str(CHART), "--namespace", "ns", *values_args(case)]
    for s in sets:
        args += ["--set", s]
    out = helm(*args)
    assert out.returncode == 0, out.stderr
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def one(docs, kind: str, name_suffix: str = "") -> dict:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"expected one {kind} *{name_suffix}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def kinds(docs) -> set[str]:
    return {d["kind"] for d in docs}


def server(docs) -> dict:
    return one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def flag(container: dict, name: str) -> str:
    args = container["args"]
    assert name in args, f"{name} not in {args}"
    return args[args.index(name) + 1]


def reject(*extra: str) -> str:
    """Run helm template with values that must be refused; return its message."""
    out = helm("template", "rel", str(CHART), *extra)
    assert out.returncode != 0, f"helm accepted {extra}"
    return out.stderr


# ---- lint, render, validate -------------------------------------------------------------

def test_examples_exist():
    assert {p.name for p in EXAMPLES} >= {"cpu-only.yaml", "gpu-ray.yaml", "external-redis.yaml", "tls-auth.yaml"}


@pytest.mark.parametrize("case", CASES)
def test_lint_strict(case):
    out = helm("lint", "--strict", str(CHART), *values_args(case))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 chart(s) failed" in out.stdout


def pod_templates(doc: dict):
    """(where, pod template) for every pod template embedded in a CRD."""
    if doc["kind"] == "RayCluster":
        yield "headGroupSpec", doc["spec"]["headGroupSpec"]["template"]
        for group in doc["spec"]["workerGroupSpecs"]:
            yield f"workerGroupSpecs[{group['groupName']}]", group["template"]


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("case", CASES)
def test_manifests_validate_against_kubernetes(case, version):
    for doc in render(case):
        what = f"{doc['kind']}/{doc['metadata']['name']}"
        if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
            # No OpenAPI schema for operator CRDs here: validate what is core inside them.
            for where, template in pod_templates(doc):
                wrapped = {"apiVersion": "v1", "kind": "PodTemplate",
                           "metadata": {"name": f"{doc['metadata']['name']}-{where}"}, "template": template}
                kubernetes_validate.validate(wrapped, version, strict=True)
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{case}: {what} invalid for Kubernetes {version}: {'.'.join(map(str, exc.path))}: {exc.message}")


@pytest.mark.parametrize("case", CASES)
def test_names_are_unique_and_labelled(case):
    docs = render(case)
    keys = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert len(keys) == len(set(keys))
    for d in docs:
        assert d["metadata"]["labels"]["app.kubernetes.io/instance"] == "rel"


# ---- the front end ------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES)
def test_server_runs_ragkv_serve_hardened(case):
    docs = render(case)
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    c = server(docs)
    assert c["args"][:3] == ["serve", "--host", "0.0.0.0"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for path in ("/tmp", "/var/cache/ragkv"):
        assert "emptyDir" in volumes[mounts[path]], f"{path} must be an emptyDir"
    env_from = [e["configMapRef"]["name"] for e in c["envFrom"]]
    cm = one(docs, "ConfigMap")
    assert cm["metadata"]["name"] in env_from
    assert cm["data"]["RAGKV_CACHE_DIR"] == "/var/cache/ragkv"
    # The server's SIGTERM drain fits inside the pod's grace period.
    assert 0 < float(cm["data"]["RAGKV_GRACE_S"]) < pod["terminationGracePeriodSeconds"]
    assert c["resources"]["requests"] and c["resources"]["limits"]
    assert "--retain-memory" in c["args"]  # the default; the value turns it off
    assert "--no-retain-memory" in server(render(case, "server.retainMemory=false"))["args"]


@pytest.mark.parametrize("case", [c for c in CASES if c != "tls-auth"])
def test_probes_are_native_grpc_on_the_health_port(case):
    c = server(render(case))
    port = flag(c, "--port")
    assert {p["name"]: p["containerPort"] for p in c["ports"]}["grpc"] == int(port)
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["grpc"] == {"port": int(port)}, probe  # grpc.health.v1, overall server status


def test_tls_probes_fall_back_to_tcp():
    # kubelet's gRPC probe has no TLS; a gRPC probe against a TLS port would always fail.
    c = server(render("tls-auth"))
    for probe in ("livenessProbe", "readinessProbe"):
        assert "grpc" not in c[probe] and c[probe]["tcpSocket"]["port"] == "grpc"


def test_service_exposes_grpc_and_metrics():
    docs = render()
    svc = one(docs, "Service", "-ragkv")
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    assert ports["grpc"]["targetPort"] == "grpc" and ports["grpc"]["appProtocol"] == "grpc"
    assert ports["metrics"]["targetPort"] == "metrics"
    c = server(docs)
    assert flag(c, "--metrics-port") == "9090"
    assert svc["spec"]["selector"] == one(docs, "Deployment")["spec"]["selector"]["matchLabels"]


def test_pdb_and_optional_hpa():
    docs = render()
    assert one(docs, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    assert "HorizontalPodAutoscaler" not in kinds(docs)
    assert one(docs, "Deployment")["spec"]["replicas"] == 2
    scaled = render("default", "autoscaling.enabled=true", "autoscaling.maxReplicas=5")
    hpa = one(scaled, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["maxReplicas"] == 5 and hpa["spec"]["scaleTargetRef"]["kind"] == "Deployment"
    assert "replicas" not in one(scaled, "Deployment")["spec"], "HPA owns replicas"
    assert "PodDisruptionBudget" not in kinds(render("cpu-only"))


def test_service_monitor_is_optional_and_scrapes_metrics_port():
    assert "ServiceMonitor" not in kinds(render())
    docs = render("gpu-ray")
    sm = one(docs, "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    svc = one(docs, "Service", "-ragkv")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()


# ---- secrets: token, TLS, store URL -------------------------------------------------------

def secret_ref(container: dict, env_name: str) -> dict:
    env = {e["name"]: e for e in container["env"]}
    assert env_name in env, f"{env_name} not in env"
    return env[env_name]["valueFrom"]["secretKeyRef"]


def test_token_comes_from_a_secret():
    docs = render("default", "auth.enabled=true", "auth.token=s3cr3t-token")
    c = server(docs)
    # `ragkv serve` reads RAGKV_TOKEN; a --token flag would show the token in the process list.
    assert not any(a.startswith("--token") for a in c["args"])
    ref = secret_ref(c, "RAGKV_TOKEN")
    secret = one(docs, "Secret", "-auth")
    assert ref == {"name": secret["metadata"]["name"], "key": "token"}
    assert secret["stringData"]["token"] == "s3cr3t-token"
    spec_text = yaml.safe_dump([d for d in docs if d["kind"] != "Secret"])
    assert "s3cr3t-token" not in spec_text, "token leaked outside its Secret"


def test_tls_auth_example_mounts_tls_and_uses_existing_secrets():
    docs = render("tls-auth")
    c = server(docs)
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert flag(c, "--tls-cert") == "/etc/ragkv/tls/tls.crt"
    assert flag(c, "--tls-key") == "/etc/ragkv/tls/tls.key"
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == "/etc/ragkv/tls")
    assert mount["readOnly"] is True
    vol = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert vol["secret"]["secretName"] == "ragkv-tls"
    assert secret_ref(c, "RAGKV_TOKEN") == {"name": "ragkv-token", "key": "token"}
    assert not [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"].endswith(("-tls", "-auth"))], \
        "existing secrets must not be re-created"


def test_inline_tls_pair_becomes_a_tls_secret():
    docs = render("default", "tls.enabled=true", "tls.cert=CERT", "tls.key=KEY")
    secret = one(docs, "Secret", "-tls")
    assert secret["type"] == "kubernetes.io/tls"
    assert set(secret["data"]) == {"tls.crt", "tls.key"}


def test_store_url_is_never_in_a_configmap():
    docs = render("default", "redis.enabled=false", "externalRedis.url=redis://:hunter2@redis.example:6379/0")
    for cm in (d for d in docs if d["kind"] == "ConfigMap"):
        assert "hunter2" not in yaml.safe_dump(cm)
    c = server(docs)
    assert "--store" not in c["args"], "the URL reaches the server as RAGKV_STORE from a Secret"
    ref = secret_ref(c, "RAGKV_STORE")
    secret = one(docs, "Secret", "-store")
    assert ref["name"] == secret["metadata"]["name"]
    assert secret["stringData"][ref["key"]] == "redis://:hunter2@redis.example:6379/0"
    assert "StatefulSet" not in kinds(docs)


def test_external_redis_example_reads_existing_secret_in_cluster_mode():
    docs = render("external-redis")
    c = server(docs)
    assert secret_ref(c, "RAGKV_STORE") == {"name": "ragkv-redis", "key": "redis-url"}
    assert one(docs, "ConfigMap")["data"]["RAGKV_REDIS_CLUSTER"] == "1"
    assert "StatefulSet" not in kinds(docs)
    assert not [d for d in docs if d["kind"] == "Secret"]


def test_redis_cluster_example_puts_the_node_list_in_the_store_secret():
    from kvstore.backends.redis_cluster import parse_cluster_url

    docs = render("redis-cluster", "externalRedis.password=pa55word")
    c = server(docs)
    ref = secret_ref(c, "RAGKV_STORE")
    secret = one(docs, "Secret", "-store")
    assert ref["name"] == secret["metadata"]["name"]
    nodes = yaml.safe_load((CHART / "examples" / "redis-cluster.yaml").read_text())["externalRedis"]["clusterNodes"]
    url = secret["stringData"][ref["key"]]
    assert url == "redis+cluster://:pa55word@" + ",".join(nodes)
    assert parse_cluster_url(url)["nodes"] == [(n.rsplit(":", 1)[0], int(n.rsplit(":", 1)[1])) for n in nodes]
    assert one(docs, "ConfigMap")["data"]["RAGKV_REDIS_CLUSTER"] == "1"
    assert "StatefulSet" not in kinds(docs)
    assert "pa55word" not in yaml.safe_dump([d for d in docs if d["kind"] != "Secret"])


# ---- bundled Redis ------------------------------------------------------------------------

def test_bundled_redis_statefulset():
    docs = render("cpu-only")
    sts = one(docs, "StatefulSet", "-redis")
    headless = one(docs, "Service", "-redis")
    assert headless["spec"]["clusterIP"] == "None"
    assert sts["spec"]["serviceName"] == headless["metadata"]["name"]
    c = sts["spec"]["template"]["spec"]["containers"][0]
    assert flag(c, "--maxmemory") == "2gb"
    assert flag(c, "--maxmemory-policy") == "allkeys-lru"
    assert flag(c, "--appendonly") == "yes"
    claim = sts["spec"]["volumeClaimTemplates"][0]
    assert claim["metadata"]["name"] == "data" and claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    assert sts["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    url = one(docs, "Secret", "-store")["stringData"]["redis-url"]
    assert url == f"redis://{sts['metadata']['name']}-0.{headless['metadata']['name']}.ns.svc:6379/0"


def test_bundled_redis_password_stays_in_the_secret():
    docs = render("default", "redis.password=pa55word", "redis.persistence.enabled=false")
    sts = one(docs, "StatefulSet", "-redis")
    c = sts["spec"]["template"]["spec"]["containers"][0]
    assert flag(c, "--requirepass") == "$(REDIS_PASSWORD)"
    assert "volumeClaimTemplates" not in sts["spec"]
    assert one(docs, "Secret", "-store")["stringData"]["redis-url"].startswith("redis://:pa55word@")
    assert "pa55word" not in yaml.safe_dump([d for d in docs if d["kind"] != "Secret"])


# ---- Ray, GPUs and the model volume -------------------------------------------------------

def test_inproc_without_ray():
    docs = render()
    assert flag(server(docs), "--workers") == "inproc"
    assert "RayCluster" not in kinds(docs)


def test_gpu_ray_example_wires_raycluster():
    docs = render("gpu-ray")
    rc = one(docs, "RayCluster")
    assert rc["apiVersion"] == "ray.io/v1"
    head_svc = f"{rc['metadata']['name']}-head-svc"  # KubeRay's naming of the head Service
    assert flag(server(docs), "--workers") == f"ray://{head_svc}.ns.svc:10001"
    head = rc["spec"]["headGroupSpec"]["template"]["spec"]
    assert {p["name"]: p["containerPort"] for p in head["containers"][0]["ports"]}["client"] == 10001
    assert "nvidia.com/gpu" not in head["containers"][0]["resources"].get("limits", {})
    (group,) = rc["spec"]["workerGroupSpecs"]
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (2, 1, 4)
    worker = group["template"]["spec"]
    wc = worker["containers"][0]
    assert wc["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert wc["resources"]["limits"]["memory"] == "32Gi"
    assert worker["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in worker["tolerations"]
    for spec in (head, worker):
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["containers"][0]["image"].endswith("-cuda")
        assert "/models" in {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}


@pytest.mark.parametrize("case, source, model_arg", [
    ("cpu-only", "baked", "default"),
    ("gpu-ray", "persistentVolumeClaim", "/models/smollm2-135m-instruct"),
    ("external-redis", "hostPath", "/models/smollm2-135m-instruct"),
    ("tls-auth", "emptyDir", "/models/smollm2-135m-instruct"),
])
def test_model_volume(case, source, model_arg):
    docs = render(case)
    c = server(docs)
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert flag(c, "--model") == model_arg
    volumes = {v["name"]: v for v in pod["volumes"]}
    if source == "baked":
        assert "model" not in volumes
        return
    assert source in volumes["model"]
    assert {"name": "model", "mountPath": "/models", "readOnly": True} in c["volumeMounts"]
    if case == "tls-auth":  # copied from a model image, nothing downloaded
        (init,) = pod["initContainers"]
        assert init["command"][:2] == ["cp", "-R"]
        assert init["command"][-1] == "/models/smollm2-135m-instruct"
        assert init["securityContext"]["readOnlyRootFilesystem"] is True
    if case == "gpu-ray":
        assert volumes["model"]["persistentVolumeClaim"] == {"claimName": "ragkv-models", "readOnly": True}


# ---- helm test pod ------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES)
def test_helm_test_pod_uses_the_sdk(case):
    docs = render(case)
    pod = next(d for d in docs if d["kind"] == "Pod" and d["metadata"]["annotations"].get("helm.sh/hook") == "test")
    c = pod["spec"]["containers"][0]
    assert pod["spec"]["restartPolicy"] == "Never"
    assert c["command"] == ["python", "-c"]
    script = c["args"][0]
    compile(script, "helm-test", "exec")  # valid Python
    assert "RagKVClient" in script and ".health()" in script and ".generate(" in script
    env = {e["name"]: e for e in c["env"]}
    svc = one(docs, "Service", "-ragkv")
    assert env["RAGKV_ADDR"]["value"] == f"{svc['metadata']['name']}.ns.svc:50051"
    assert ("RAGKV_TOKEN" in env) == (case == "tls-auth")
    assert c["securityContext"]["readOnlyRootFilesystem"] is True


def test_notes_render():
    out = helm("install", "rel", str(CHART), "--dry-run=client", "-f", str(CHART / "examples" / "gpu-ray.yaml"))
    assert out.returncode == 0, out.stderr
    notes = out.stdout.split("NOTES:", 1)[1]
    assert "helm test rel" in notes and "ray://" in notes


# ---- values schema ------------------------------------------------------------------------

def test_schema_rejects_both_stores():
    msg = reject("--set", "externalRedis.url=redis://redis.example:6379/0")
    assert "both set: choose ONE store" in msg


def test_schema_rejects_no_store():
    msg = reject("--set", "redis.enabled=false")
    assert "no store: set redis.enabled=true" in msg


def test_schema_rejects_unknown_keys():
    assert "additional properties 'replicas' not allowed" in reject("--set", "replicas=3")
    assert "at '/redis': additional properties 'maxmem' not allowed" in reject("--set", "redis.maxmem=1gb")


def test_schema_rejects_bad_values_file():
    bad = BAD_VALUES / "bad-both-redis.yaml"
    msg = reject("-f", str(bad))
    assert "additional properties 'maxmemroy' not allowed" in msg
    assert "choose ONE store" in msg
    lint = helm("lint", "--strict", str(CHART), "-f", str(bad))
    assert lint.returncode != 0 and "1 chart(s) failed" in lint.stdout + lint.stderr


@pytest.mark.parametrize("sets, message", [
    (["auth.enabled=true"], "auth.enabled=true needs auth.token or auth.existingSecret"),
    (["tls.enabled=true", "tls.cert=C"], "tls.enabled=true needs tls.existingSecret"),
    (["model.source=pvc", "model.dir=m"], "model.source=pvc needs model.pvc.existingClaim"),
    (["model.source=hostPath"], "needs model.dir"),
    (["externalRedis.cluster=true"], "externalRedis.cluster=true needs the external Redis"),
    (["redis.enabled=false", "externalRedis.cluster=true", "externalRedis.url=redis://r:6379/0"],
     "at '/externalRedis/url': 'redis://r:6379/0' does not match pattern"),
    (["redis.enabled=false", "externalRedis.clusterNodes={r-0:6379}", "externalRedis.url=redis+cluster://r-0:6379"],
     "give the cluster one way"),
    (["redis.enabled=false", "externalRedis.clusterNodes={r 0:6379}"], "/externalRedis/clusterNodes/0"),
    (["server.codec=zip"], "/server/codec"),
    (["redis.image.tag=latest"], "/redis/image/tag"),
])
def test_schema_rejects_inconsistent_settings(sets, message):
    args = [a for s in sets for a in ("--set", s)]
    assert message in reject(*args)


@pytest.mark.parametrize("case, scheme", [("default", "HTTP"), ("tls-auth", "HTTPS")])
def test_http_api_port_on_the_service_with_health_probes(case, scheme):
    assert "http" not in {p["name"] for p in server(render(case))["ports"]}  # off unless asked for
    docs = render(case, "server.httpPort=8000")
    c = server(docs)
    assert flag(c, "--http-port") == "8000"
    assert {p["name"]: p["containerPort"] for p in c["ports"]}["http"] == 8000
    ports = {p["name"]: p for p in one(docs, "Service", "-ragkv")["spec"]["ports"]}
    assert ports["http"]["port"] == 8000 and ports["http"]["targetPort"] == "http"
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": "http", "scheme": scheme}, probe
    for version in K8S_VERSIONS:
        for doc in docs:
            if (doc["apiVersion"], doc["kind"]) not in CRD_KINDS:
                kubernetes_validate.validate(doc, version, strict=True)
