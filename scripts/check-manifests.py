#!/usr/bin/env python3
"""Offline checks of onramp's Kubernetes manifests (run by scripts/check-deploy).

    check-manifests.py --schemas deploy/schemas --kube-version 1.37.0 LABEL=FILE...

Every YAML document of every FILE is validated:
  - Kubernetes kinds against the Kubernetes JSON schemas of each --kube-version, strict (an
    unknown field is an error), with kubernetes-validate (PyPI), which carries the schemas;
  - slurm.nebius.ai kinds against the JSON schemas in --schemas (<kind>.json), with jsonschema;
  - duplicate keys in a mapping are errors (YAML parsers silently keep the last one).
Then onramp's own rules: the pods run as 65532 with a read-only root filesystem, no privilege
escalation, no capabilities and the runtime's seccomp profile, with resources and a /tmp
emptyDir; Deployments have liveness and readiness probes; the API's service account has no
token and no binding; every file a setting points at (*_FILE, ONRAMP_TENANTS, …) is mounted.
Prints one line per problem and exits 1 if there is any.
"""

import argparse
import json
import os
import sys

import jsonschema
import kubernetes_validate
import yaml

CUSTOM_GROUP = "slurm.nebius.ai/"
PATH_SETTINGS = ("ONRAMP_TENANTS", "ONRAMP_SLURM_SSH_KNOWN_HOSTS")
API_SA = "onramp-api"


class UniqueKeyLoader(yaml.SafeLoader):
    pass


def _mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def describe(doc):
    meta = doc.get("metadata") or {}
    return f"{doc.get('kind', '?')}/{meta.get('name', '?')}"


def where(error):
    path = "/".join(str(p) for p in error.absolute_path)
    return f"{path}: {error.message}" if path else error.message


def validate_doc(doc, versions, schemas, problems, label):
    name = describe(doc)
    api = str(doc.get("apiVersion", ""))
    if api.startswith(CUSTOM_GROUP):
        path = os.path.join(schemas, f"{str(doc.get('kind', '')).lower()}.json")
        if not os.path.exists(path):
            problems.append(f"{label}: {name}: no schema {path} for {api}")
            return
        with open(path) as f:
            schema = json.load(f)
        validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
        for e in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path)):
            problems.append(f"{label}: {name}: {where(e)} ({os.path.basename(path)})")
        return
    for v in versions:
        try:
            kubernetes_validate.validate(doc, v, strict=True)
        except kubernetes_validate.ValidationError as e:
            problems.append(f"{label}: {name}: {where(e)} (Kubernetes {v}, strict)")
        except kubernetes_validate.SchemaNotFoundError:
            problems.append(f"{label}: {name}: {api} {doc.get('kind')} is no Kubernetes {v} kind")


def pod_specs(doc):
    kind = doc.get("kind")
    spec = doc.get("spec") or {}
    if kind in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
        return [(spec.get("template") or {}).get("spec") or {}]
    if kind == "CronJob":
        return [((spec.get("jobTemplate") or {}).get("spec") or {}).get("template", {}).get("spec") or {}]
    return []


def check_pod(doc, pod, configmaps, problems, label):
    name = describe(doc)
    psc = pod.get("securityContext") or {}
    if psc.get("runAsNonRoot") is not True or psc.get("runAsUser") != 65532:
        problems.append(f"{label}: {name}: pod must run as non-root user 65532")
    if (psc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
        problems.append(f"{label}: {name}: pod needs seccompProfile RuntimeDefault")
    if pod.get("serviceAccountName") == API_SA and pod.get("automountServiceAccountToken") is not False:
        problems.append(f"{label}: {name}: {API_SA} pods must not mount a token")
    volumes = {v.get("name"): v for v in pod.get("volumes") or []}
    for c in pod.get("initContainers") or []:
        check_container_security(f"{name} init container {c.get('name')}", c, problems, label)
    for c in pod.get("containers") or []:
        cname = f"{name} container {c.get('name')}"
        check_container_security(cname, c, problems, label)
        res = c.get("resources") or {}
        if not (res.get("requests") or {}).get("memory") or not (res.get("limits") or {}).get("memory"):
            problems.append(f"{label}: {cname}: needs memory requests and limits")
        mounts = c.get("volumeMounts") or []
        if not any(m.get("mountPath") == "/tmp" and "emptyDir" in volumes.get(m.get("name"), {}) for m in mounts):
            problems.append(f"{label}: {cname}: needs an emptyDir on /tmp (read-only root filesystem)")
        if doc.get("kind") == "Deployment":
            for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
                if ((c.get(probe) or {}).get("httpGet") or {}).get("path") != path:
                    problems.append(f"{label}: {cname}: {probe} must GET {path}")
        for var, value in container_env(c, configmaps):
            if (var.endswith("_FILE") or var in PATH_SETTINGS) and value:
                missing = unmounted(value, mounts, volumes, configmaps)
                if missing:
                    problems.append(f"{label}: {cname}: {var}={value}: {missing}")


def check_container_security(cname, c, problems, label):
    sc = c.get("securityContext") or {}
    if sc.get("readOnlyRootFilesystem") is not True:
        problems.append(f"{label}: {cname}: readOnlyRootFilesystem must be true")
    if sc.get("allowPrivilegeEscalation") is not False:
        problems.append(f"{label}: {cname}: allowPrivilegeEscalation must be false")
    if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
        problems.append(f"{label}: {cname}: capabilities must drop ALL")


def container_env(c, configmaps):
    out = [(e.get("name"), e.get("value")) for e in c.get("env") or [] if "value" in e]
    for src in c.get("envFrom") or []:
        ref = (src.get("configMapRef") or {}).get("name")
        out += list((configmaps.get(ref) or {}).items())
    return out


def unmounted(path, mounts, volumes, configmaps):
    """Why the file at `path` is not provided by a mount (None when it is or cannot be known)."""
    best = None
    for m in mounts:
        mp = m.get("mountPath", "").rstrip("/")
        if path.startswith(mp + "/") and (best is None or len(mp) > len(best.get("mountPath", ""))):
            best = m
    if best is None:
        return "no volume is mounted there"
    rel = path[len(best["mountPath"].rstrip("/")) + 1:]
    vol = volumes.get(best.get("name")) or {}
    src = vol.get("secret") or vol.get("configMap")
    if src is None:
        return None
    if src.get("items") is not None:
        if rel not in [i.get("path") for i in src["items"]]:
            return f"volume {best.get('name')} has no item {rel}"
    elif "configMap" in vol and src.get("name") in configmaps and rel not in configmaps[src["name"]]:
        return f"ConfigMap {src.get('name')} has no key {rel}"
    return None


def check_bindings(doc, problems, label):
    if doc.get("kind") in ("RoleBinding", "ClusterRoleBinding"):
        for s in doc.get("subjects") or []:
            if s.get("name") == API_SA:
                problems.append(f"{label}: {describe(doc)}: {API_SA} must have no Kubernetes rights")
    if doc.get("kind") == "ServiceAccount" and (doc.get("metadata") or {}).get("name") == API_SA:
        if doc.get("automountServiceAccountToken") is not False:
            problems.append(f"{label}: {describe(doc)}: automountServiceAccountToken must be false")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--schemas", required=True)
    ap.add_argument("--kube-version", action="append", required=True)
    ap.add_argument("sources", nargs="+", metavar="LABEL=FILE")
    args = ap.parse_args()
    problems, count = [], 0
    for source in args.sources:
        label, _, path = source.partition("=")
        try:
            with open(path or label) as f:
                docs = [d for d in yaml.load_all(f, Loader=UniqueKeyLoader) if d is not None]
        except (OSError, yaml.YAMLError) as e:
            problems.append(f"{label}: {e}".replace("\n", " "))
            continue
        configmaps = {}
        for d in docs:
            if isinstance(d, dict) and d.get("kind") == "ConfigMap":
                configmaps[(d.get("metadata") or {}).get("name")] = d.get("data") or {}
        for d in docs:
            if not isinstance(d, dict) or "apiVersion" not in d or "kind" not in d:
                problems.append(f"{label}: a document without apiVersion and kind")
                continue
            count += 1
            validate_doc(d, args.kube_version, args.schemas, problems, label)
            check_bindings(d, problems, label)
            for pod in pod_specs(d):
                check_pod(d, pod, configmaps, problems, label)
    for p in problems:
        print(f"check-deploy: {p}", file=sys.stderr)
    versions = ", ".join(args.kube_version)
    print(f"check-deploy: {count} documents from {len(args.sources)} sources, Kubernetes {versions} (strict)"
          f" and deploy/schemas: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
