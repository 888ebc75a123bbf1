#!/usr/bin/python3
"""Validates deploy/llm-d/ offline, as far as a cluster's API server and llm-d's EPP would, without either.

- Deployment, Service, PersistentVolumeClaim: every field against the Kubernetes API's own types as Debian's
  python3-kubernetes carries them (generated from the Kubernetes OpenAPI spec): unknown fields (which `kubectl
  apply`'s strict field validation rejects), wrong types and missing required fields are errors.
- InferencePool: against the openAPIV3Schema of the Gateway API Inference Extension's CRD, vendored in
  tests/deploy/schemas/ from kubernetes-sigs/gateway-api-inference-extension at tag v1.6.0 (commit
  992e5c292afb248801ce8d9234eb5b9d28eea231, config/crd/bases/inference.networking.k8s.io_inferencepools.yaml),
  with unknown fields errors as the API server's strict validation makes them (its CEL rules are not run here).
- EndpointPickerConfig (endpoint-picker-config.yaml, and the copy epp-values.yaml embeds): against
  tests/deploy/schemas/endpoint-picker-config.schema.json, written from llm-d-router's Go types (see its $comment).
- Across files: the names and numbers that must agree (block size, events port, labels, model name, metric names).

`--self-test` also breaks copies of the manifests in the ways an edit could and checks that each is caught.
Needs Debian's python3-kubernetes, python3-jsonschema and python3-yaml (scripts/install-deps.sh).
"""
import copy
import json
import re
import sys
from pathlib import Path

import jsonschema
import yaml
from kubernetes.client import models as k8s_models

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "llm-d"
SCHEMAS = Path(__file__).resolve().parent / "schemas"

CORE_KINDS = {
    ("apps/v1", "Deployment"): "V1Deployment",
    ("v1", "Service"): "V1Service",
    ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim",
}
# python3-kubernetes types Quantity and IntOrString loosely ('str', 'object'); these keys hold quantities.
QUANTITY_MAPS = {("V1ResourceRequirements", "limits"), ("V1ResourceRequirements", "requests")}
QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[munkMGTPE]|[KMGTPE]i)?$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
PORT_NAME = re.compile(r"^(?=.*[a-z])[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # IANA_SVC_NAME


def check_k8s_object(value, type_name, path, errors, parent=None):
    """Walks `value` against the python3-kubernetes model `type_name`, appending what the API server would reject."""
    if value is None:
        return
    if type_name.startswith("list["):
        if not isinstance(value, list):
            errors.append(f"{path}: expected a list")
            return
        for i, item in enumerate(value):
            check_k8s_object(item, type_name[5:-1], f"{path}[{i}]", errors, parent)
        return
    if type_name.startswith("dict("):
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a map")
            return
        inner = type_name[type_name.index(",") + 1:-1].strip()
        for k, v in value.items():
            if parent in QUANTITY_MAPS:
                if not isinstance(v, (str, int, float)) or not QUANTITY.match(str(v)):
                    errors.append(f"{path}.{k}: not a quantity: {v!r}")
            else:
                check_k8s_object(v, inner, f"{path}.{k}", errors)
        return
    scalar = {"str": str, "int": int, "bool": bool, "float": (int, float), "datetime": str, "date": str}
    if type_name in scalar:
        if type_name == "int" and isinstance(value, bool) or not isinstance(value, scalar[type_name]):
            errors.append(f"{path}: expected {type_name}, got {type(value).__name__} {value!r}")
        return
    if type_name == "object":  # IntOrString, RawExtension
        return
    cls = getattr(k8s_models, type_name)
    if not isinstance(value, dict):
        errors.append(f"{path}: expected an object ({type_name})")
        return
    json_to_attr = {j: a for a, j in cls.attribute_map.items()}
    for key, item in value.items():
        if key not in json_to_attr:
            errors.append(f"{path}: unknown field {key!r} in {type_name}")
            continue
        attr = json_to_attr[key]
        check_k8s_object(item, cls.openapi_types[attr], f"{path}.{key}", errors, (type_name, key))
    # The generated constructor raises for a required field left out.
    try:
        cls(**{json_to_attr[k]: v for k, v in value.items() if k in json_to_attr})
    except ValueError as e:
        errors.append(f"{path}: {type_name}: {e}")


def strict_crd_schema(schema):
    """The CRD's structural schema with unknown fields forbidden where it lists properties, as the API server's strict
    field validation treats them (x-kubernetes-preserve-unknown-fields keeps them)."""
    schema = copy.deepcopy(schema)

    def walk(s):
        if not isinstance(s, dict):
            return
        if "properties" in s and not s.get("x-kubernetes-preserve-unknown-fields"):
            s.setdefault("additionalProperties", False)
        for k in ("properties",):
            for sub in s.get(k, {}).values():
                walk(sub)
        for k in ("items", "additionalProperties"):
            walk(s.get(k))

    walk(schema)
    schema["properties"]["metadata"] = {"type": "object"}  # checked as V1ObjectMeta below
    return schema


def load_crd_schemas():
    crd = yaml.safe_load((SCHEMAS / "inference.networking.k8s.io_inferencepools-v1.6.0.yaml").read_text())
    out = {}
    for version in crd["spec"]["versions"]:
        api_version = f"{crd['spec']['group']}/{version['name']}"
        out[(api_version, crd["spec"]["names"]["kind"])] = strict_crd_schema(version["schema"]["openAPIV3Schema"])
    return out


def schema_errors(schema, document, path):
    validator = jsonschema.Draft202012Validator(schema)
    return [f"{path}: {'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
            for e in validator.iter_errors(document)]


def load_files(files):
    """{file name: [documents]} for deploy/llm-d/*.yaml, each file given as its text."""
    return {name: [d for d in yaml.safe_load_all(text) if d is not None] for name, text in files.items()}


def object_errors(docs, crd_schemas, epp_schema):
    errors = []
    for name, documents in docs.items():
        for i, doc in enumerate(documents):
            where = f"{name}#{i}"
            if not isinstance(doc, dict):
                errors.append(f"{where}: not a map")
                continue
            key = (doc.get("apiVersion"), doc.get("kind"))
            if key in CORE_KINDS:
                check_k8s_object(doc, CORE_KINDS[key], where, errors)
            elif key in crd_schemas:
                errors += schema_errors(crd_schemas[key], doc, where)
                check_k8s_object(doc.get("metadata"), "V1ObjectMeta", f"{where}.metadata", errors)
            elif key[1] == "EndpointPickerConfig":
                errors += schema_errors(epp_schema, doc, where)
            elif key == ("kustomize.config.k8s.io/v1beta1", "Kustomization"):
                pass  # checked with the other files below
            elif name == "epp-values.yaml":
                pass
            else:
                errors.append(f"{where}: no schema for {key}")
    return errors


def one(docs, kind):
    found = [d for documents in docs.values() for d in documents if isinstance(d, dict) and d.get("kind") == kind]
    if len(found) != 1:
        raise LookupError(f"expected one {kind}, found {len(found)}")
    return found[0]


def flag(args, name):
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
    return values[0] if len(values) == 1 else None


def consistency_errors(docs):
    """What must agree between the files for the pieces to meet in a cluster."""
    errors = []
    try:
        deployment = one(docs, "Deployment")
        service = one(docs, "Service")
        pool = one(docs, "InferencePool")
        epp = docs["endpoint-picker-config.yaml"][0]
        values = docs["epp-values.yaml"][0]
        kustomization = one(docs, "Kustomization")
    except (LookupError, KeyError, IndexError) as e:
        return [str(e)]

    pod = deployment["spec"]["template"]
    labels = pod["metadata"].get("labels", {})
    container = pod["spec"]["containers"][0]
    args = container.get("args", [])
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
    plugins = {p["type"]: p.get("parameters", {}) for p in epp.get("plugins", [])}

    def expect(cond, message):
        if not cond:
            errors.append(message)

    # Kubernetes' own cross-field rules that the type walk does not see.
    selector = deployment["spec"]["selector"].get("matchLabels", {})
    expect(selector.items() <= labels.items(), "Deployment: selector.matchLabels must match the pod template's labels")
    for pname in ports:
        expect(pname is None or (len(pname) <= 15 and PORT_NAME.match(pname)), f"container port name {pname!r} invalid")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        port = container.get(probe, {}).get("httpGet", {}).get("port")
        expect(port in ports or port in ports.values(), f"{probe} names port {port!r}, which the container lacks")
        expect(container.get(probe, {}).get("httpGet", {}).get("path") == "/health", f"{probe} must probe /health")
    for a in args:
        for ref in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", a):
            expect(ref in env, f"argument {a!r} refers to $({ref}), which the container's env lacks")
    mounts = {m["name"] for m in container.get("volumeMounts", [])}
    volumes = {v["name"] for v in pod["spec"].get("volumes", [])}
    expect(mounts <= volumes, f"volumeMounts {sorted(mounts - volumes)} name no volume")
    expect(DNS_LABEL.match(container["name"]) is not None, "container name is not a DNS label")

    # keepwarm serve's flags against the EPP's view of it.
    expect(args[:1] == ["serve"], "the container must run `keepwarm serve`")
    events = flag(args, "kv-events")
    expect(events is not None, "keepwarm serve needs --kv-events=tcp://*:PORT")
    kv = plugins.get("precise-prefix-cache-producer", {})
    socket_port = kv.get("kvEventsConfig", {}).get("podDiscoveryConfig", {}).get("socketPort")
    if events:
        expect(events == f"tcp://*:{socket_port}", f"--kv-events={events} but the EPP dials port {socket_port}")
        expect(ports.get("kv-events") == socket_port, f"container port kv-events must be {socket_port}")
    block = kv.get("tokenProcessorConfig", {}).get("blockSizeTokens")
    expect(flag(args, "cache-block") == str(block), f"--cache-block must equal the EPP's blockSizeTokens {block}")
    selector_text = kv.get("kvEventsConfig", {}).get("podDiscoveryConfig", {}).get("podLabelSelector", "")
    for term in filter(None, selector_text.split(",")):
        k, _, v = term.partition("=")
        expect(labels.get(k) == v, f"the EPP's podLabelSelector term {term!r} matches no pod label")
    engine_label = plugins.get("core-metrics-extractor", {}).get("engineLabelKey", "llm-d.ai/engine-type")
    engines = [e["name"] for e in plugins.get("core-metrics-extractor", {}).get("engineConfigs", [])]
    expect(labels.get(engine_label) in engines, f"pod label {engine_label}={labels.get(engine_label)!r} names no "
                                                f"engineConfigs entry ({engines})")
    http_port = ports.get("http")
    expect(flag(args, "port") == str(http_port), "--port must be the container port named http")
    expect([p["number"] for p in pool["spec"]["targetPorts"]] == [http_port], "InferencePool targetPorts != http")
    expect(pool["spec"]["selector"]["matchLabels"].items() <= labels.items(), "InferencePool selects no keepwarm pod")
    expect(service["spec"]["selector"].items() <= labels.items(), "Service selects no keepwarm pod")

    model = env.get("KEEPWARM_MODEL_NAME")
    expect(flag(args, "alias") == "$(KEEPWARM_MODEL_NAME)", "--alias must be $(KEEPWARM_MODEL_NAME)")
    expect(plugins.get("token-producer", {}).get("modelName") == model, "token-producer modelName != the pods' model")

    # epp-values.yaml embeds endpoint-picker-config.yaml and agrees with the pool.
    router = values.get("router", {})
    embedded = router.get("epp", {}).get("pluginsCustomConfig", {})
    config_file = router.get("epp", {}).get("pluginsConfigFile")
    expect(config_file in embedded, "epp-values.yaml: pluginsConfigFile names no pluginsCustomConfig entry")
    if config_file in embedded:
        expect(yaml.safe_load(embedded[config_file]) == epp,
               "epp-values.yaml: the embedded EPP config differs from endpoint-picker-config.yaml")
    expect(router.get("modelServers", {}).get("matchLabels") == pool["spec"]["selector"]["matchLabels"],
           "epp-values.yaml: modelServers.matchLabels != the InferencePool's selector")
    # The token producer asks the keepwarm pods for token ids (their render routes) through the Service: its URL must
    # name that Service and its HTTP port, and the chart's render sidecar (a second tokenizer) stays off.
    render_url = plugins.get("token-producer", {}).get("vllm", {}).get("url", "")
    service_port = next((p["port"] for p in service["spec"]["ports"] if p.get("name") == "http"), None)
    service_name = service["metadata"]["name"]
    expect(re.fullmatch(rf"http://{re.escape(service_name)}(\.[a-z0-9.-]+)?:{service_port}", render_url) is not None,
           f"token-producer vllm.url {render_url!r} is not the keepwarm Service http://{service_name}:{service_port}")
    expect(not router.get("tokenizer", {}).get("enabled", False), "epp-values.yaml: the render sidecar must be off")
    expect(router.get("inferencePool", {}).get("create") is False, "epp-values.yaml: the chart must not add a pool")
    expect(pool["spec"]["endpointPickerRef"]["name"] == f"{pool['metadata']['name']}-epp",
           "InferencePool: endpointPickerRef must name the chart's EPP Service (<release>-epp)")

    resources = set(kustomization.get("resources", []))
    objects = {n for n, ds in docs.items() for d in ds if isinstance(d, dict) and
               ((d.get("apiVersion"), d.get("kind")) in CORE_KINDS or d.get("kind") == "InferencePool")}
    expect(resources == objects, f"kustomization.yaml resources {sorted(resources)} != manifests {sorted(objects)}")
    return errors


def check(files):
    docs = load_files(files)
    crd_schemas = load_crd_schemas()
    epp_schema = json.loads((SCHEMAS / "endpoint-picker-config.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(epp_schema)
    errors = object_errors(docs, crd_schemas, epp_schema)
    if "epp-values.yaml" in docs:
        router = docs["epp-values.yaml"][0].get("router", {})
        for name, text in router.get("epp", {}).get("pluginsCustomConfig", {}).items():
            errors += schema_errors(epp_schema, yaml.safe_load(text), f"epp-values.yaml:{name}")
    try:
        errors += consistency_errors(docs)
    except (KeyError, IndexError, TypeError, AttributeError) as e:  # a field the checks above reported missing
        errors.append(f"cross-file checks stopped at a missing or malformed field: {e!r}")
    return errors


def mutated(files, name, old, new):
    assert old in files[name], f"self-test: {old!r} not in {name}"
    out = dict(files)
    out[name] = files[name].replace(old, new, 1)
    return out


def self_test(files):
    """Each break must be reported: a check that passes everything would pass here too."""
    cases = [
        ("unknown container field", mutated(files, "keepwarm-deployment.yaml", "imagePullPolicy:", "imagePullPolicyy:")),
        ("string where an int goes", mutated(files, "keepwarm-deployment.yaml", "periodSeconds: 5", "periodSeconds: '5'")),
        ("missing required field", mutated(files, "keepwarm-service.yaml", "      port: 8080\n", "")),
        ("bad quantity", mutated(files, "keepwarm-deployment.yaml", "memory: 48Gi", "memory: 48Gb")),
        ("InferencePool enum", mutated(files, "inferencepool.yaml", "failureMode: FailOpen", "failureMode: Open")),
        ("InferencePool unknown field", mutated(files, "inferencepool.yaml", "appProtocol:", "protocol:")),
        ("EPP unknown plugin parameter", mutated(files, "endpoint-picker-config.yaml", "socketPort:", "socketport:")),
        ("EPP bad metric name", mutated(files, "endpoint-picker-config.yaml", "kvUsageSpec: keepwarm", "kvUsageSpec: 1keepwarm")),
        ("events port mismatch", mutated(files, "keepwarm-deployment.yaml", "tcp://*:5557", "tcp://*:5558")),
        ("block size mismatch", mutated(files, "keepwarm-deployment.yaml", "--cache-block=256", "--cache-block=64")),
        ("engine label mismatch", mutated(files, "keepwarm-deployment.yaml", "        llm-d.ai/engine-type: keepwarm",
                                                   "        llm-d.ai/engine-type: vllm")),
        ("values drift", mutated(files, "epp-values.yaml", "weight: 2.0", "weight: 3.0")),
        ("token producer on another port", mutated(mutated(files, "endpoint-picker-config.yaml", "keepwarm:8080",
                                                           "keepwarm:8000"), "epp-values.yaml", "keepwarm:8080",
                                                   "keepwarm:8000")),
        ("render sidecar back on", mutated(files, "epp-values.yaml", "tokenizer:\n    enabled: false",
                                           "tokenizer:\n    enabled: true")),
    ]
    failures = 0
    for what, broken in cases:
        errors = check(broken)
        if errors:
            print(f"self-test: {what}: caught ({errors[0]})")
        else:
            print(f"self-test: {what}: NOT caught")
            failures += 1
    return failures


def main():
    files = {p.name: p.read_text() for p in sorted(DEPLOY.glob("*.yaml"))}
    errors = check(files)
    for e in errors:
        print(f"deploy/llm-d: {e}")
    failures = len(errors)
    if "--self-test" in sys.argv[1:]:
        failures += self_test(files)
    objects = sum(len(d) for d in load_files(files).values())
    print(f"check-llm-d: {len(files)} files, {objects} documents: {'ok' if failures == 0 else 'FAILED'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
