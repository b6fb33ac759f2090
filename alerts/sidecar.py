"""The sidecar as a Kustomize component (`kubernetes/sidecar/`): `slo proxy` in front of the
engine's container in the engine's own Pod. Clients and Prometheus reach the proxy's port
through a Service; the engine is moved to the Pod's loopback and exports its request spans to
the proxy (vLLM `--otlp-traces-endpoint`, SGLang `--enable-trace --otlp-traces-endpoint`, any
other engine through the standard OTEL_EXPORTER_OTLP_TRACES_* variables)."""

from __future__ import annotations

from typing import Any

import yaml

from alerts.kubernetes import DIR, HEADER, PORT_NAME, Workload, dump_all

SIDECAR_DIR = f"{DIR}/sidecar"
COMPONENT_FILE = f"{SIDECAR_DIR}/kustomization.yaml"
PATCH_FILE = f"{SIDECAR_DIR}/deployment-patch.yaml"
ENGINE_ARGS_FILE = f"{SIDECAR_DIR}/engine-args-patch.yaml"
SERVICE_FILE = f"{SIDECAR_DIR}/service.yaml"
SPEC_FILE = f"{SIDECAR_DIR}/spec-configmap.yaml"
CONTAINER = "slo-proxy"
SPEC_DIR, TOKEN_DIR, TLS_DIR = "/etc/llm-slo/spec", "/etc/llm-slo/token", "/etc/llm-slo/tls"
# The engine flags that point its request spans at the proxy (besides the OTEL_* variables).
ENGINE_TRACE_FLAGS = {
    "vllm": ["--otlp-traces-endpoint"],
    "sglang": ["--enable-trace", "--otlp-traces-endpoint"],
}


def traces_url(workload: Workload) -> str:
    """Where the engine sends its spans: the proxy in the same Pod. Over TLS, by the
    Service's name (which the certificate carries), mapped to the loopback by hostAliases."""
    host = workload.host if workload.tls_secret else "127.0.0.1"
    return f"{workload.scheme}://{host}:{workload.port}/v1/traces"


def _proxy_args(workload: Workload) -> list[str]:
    args = [
        "--upstream",
        f"http://127.0.0.1:{workload.engine_port}",
        "--host",
        "0.0.0.0",
        "--port",
        str(workload.port),
        "--spec",
        f"{SPEC_DIR}/slo.yaml",
    ]
    if workload.model is not None:
        args += ["--model", workload.model]
    if workload.ops_token_secret is not None:
        args += ["--ops-token-file", f"{TOKEN_DIR}/{workload.ops_token_secret[1]}"]
    if workload.tls_secret is not None:
        args += ["--ssl-certfile", f"{TLS_DIR}/tls.crt", "--ssl-keyfile", f"{TLS_DIR}/tls.key"]
    return args + list(workload.proxy_args)


def _mounts(workload: Workload) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the proxy's volume mounts, the Pod's volumes)."""
    mounts: list[dict[str, Any]] = [{"name": "llm-slo-spec", "mountPath": SPEC_DIR}]
    volumes: list[dict[str, Any]] = [
        {"name": "llm-slo-spec", "configMap": {"name": f"{workload.service}-spec"}}
    ]
    if workload.ops_token_secret is not None:
        mounts.append({"name": "llm-slo-token", "mountPath": TOKEN_DIR, "readOnly": True})
        volumes.append(
            {"name": "llm-slo-token", "secret": {"secretName": workload.ops_token_secret[0]}}
        )
    if workload.tls_secret is not None:
        mounts.append({"name": "llm-slo-tls", "mountPath": TLS_DIR, "readOnly": True})
        volumes.append({"name": "llm-slo-tls", "secret": {"secretName": workload.tls_secret}})
    return mounts, volumes


def proxy_container(workload: Workload) -> dict[str, Any]:
    mounts, _ = _mounts(workload)
    probe = {"path": "/health", "port": PORT_NAME, "scheme": workload.scheme.upper()}
    return {
        "name": CONTAINER,
        "image": workload.image,
        "command": ["slo", "proxy"],
        "args": _proxy_args(workload),
        "ports": [{"name": PORT_NAME, "containerPort": workload.port, "protocol": "TCP"}],
        # /health is answered by the engine through the proxy: ready when both are.
        "readinessProbe": {"httpGet": probe, "periodSeconds": 5},
        # Alive while the proxy accepts connections: an engine still loading is no reason
        # to restart the proxy.
        "livenessProbe": {"tcpSocket": {"port": PORT_NAME}, "periodSeconds": 10},
        # One Python process: a whole CPU (docs/proxy.md's benchmark measures its cost).
        "resources": {
            "requests": {"cpu": "1", "memory": "256Mi"},
            "limits": {"memory": "1Gi"},
        },
        "volumeMounts": mounts,
    }


def engine_env(workload: Workload) -> list[dict[str, Any]]:
    """The standard OpenTelemetry variables that send the engine's spans to the proxy."""
    env: list[dict[str, Any]] = [
        {"name": "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "value": "http/protobuf"},
        {"name": "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "value": traces_url(workload)},
    ]
    if workload.ops_token_secret is not None:
        name, key = workload.ops_token_secret
        secret = {"secretKeyRef": {"name": name, "key": key}}
        env += [
            {"name": "LLM_SLO_OPS_TOKEN", "valueFrom": secret},
            # Kubernetes expands $(LLM_SLO_OPS_TOKEN), defined just above.
            {
                "name": "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
                "value": "Authorization=Bearer%20$(LLM_SLO_OPS_TOKEN)",
            },
        ]
    if workload.tls_secret is not None:
        env.append({"name": "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "value": f"{TLS_DIR}/ca.crt"})
    return env


def deployment_patch(workload: Workload) -> dict[str, Any]:
    """The strategic-merge patch: the Pod label the Service selects, the proxy container,
    the engine container's OTLP variables (merged by its name) and the volumes."""
    engine: dict[str, Any] = {"name": workload.engine_container, "env": engine_env(workload)}
    _, volumes = _mounts(workload)
    if workload.tls_secret is not None:
        engine["volumeMounts"] = [{"name": "llm-slo-tls", "mountPath": TLS_DIR, "readOnly": True}]
    pod: dict[str, Any] = {"containers": [proxy_container(workload), engine], "volumes": volumes}
    if workload.tls_secret is not None:
        pod["hostAliases"] = [{"ip": "127.0.0.1", "hostnames": [workload.host]}]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": workload.deployment},
        "spec": {"template": {"metadata": {"labels": workload.selector}, "spec": pod}},
    }


def engine_args_patch(workload: Workload) -> list[dict[str, Any]]:
    """The JSON patch appending the engine's arguments (the first container's: a list has no
    merge key, so a strategic merge would replace the engine's own): loopback, its port, and
    its trace flags. Empty for an engine we do not know the flags of."""
    flags = ENGINE_TRACE_FLAGS.get(workload.engine)
    if flags is None:
        return []
    args = ["--host", "127.0.0.1", "--port", str(workload.engine_port), *flags]
    args.append(traces_url(workload))
    path = "/spec/template/spec/containers/0/args/-"
    return [{"op": "add", "path": path, "value": value} for value in args]


def service(workload: Workload) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": workload.service,
            "namespace": workload.namespace,
            "labels": workload.selector,
        },
        "spec": {
            "selector": workload.selector,
            "ports": [{"name": PORT_NAME, "port": workload.port, "targetPort": PORT_NAME}],
        },
    }


def render_sidecar(workload: Workload, spec_text: str) -> dict[str, str]:
    """{path: text} of the component: its kustomization, the two patches, the Service and the
    spec's ConfigMap."""
    target = {"group": "apps", "version": "v1", "kind": "Deployment", "name": workload.deployment}
    patches = [{"path": "deployment-patch.yaml", "target": dict(target)}]
    files: dict[str, str] = {}
    args_patch = engine_args_patch(workload)
    if args_patch:  # before the proxy is added: containers/0 is the engine's own
        patches.insert(0, {"path": "engine-args-patch.yaml", "target": dict(target)})
        files[ENGINE_ARGS_FILE] = HEADER + yaml.safe_dump(args_patch, sort_keys=False)
    component = {
        "apiVersion": "kustomize.config.k8s.io/v1alpha1",
        "kind": "Component",
        "resources": ["service.yaml", "spec-configmap.yaml"],
        "patches": patches,
    }
    spec_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{workload.service}-spec", "namespace": workload.namespace},
        "data": {"slo.yaml": spec_text},
    }
    files[COMPONENT_FILE] = HEADER + dump_all([component])
    files[PATCH_FILE] = HEADER + dump_all([deployment_patch(workload)])
    files[SERVICE_FILE] = HEADER + dump_all([service(workload)])
    files[SPEC_FILE] = HEADER + dump_all([spec_map])
    return files
