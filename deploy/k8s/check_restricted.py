#!/usr/bin/env python3
"""Checks every pod template in deploy/k8s against the Pod Security "restricted" profile and
the deployment rules of docs/OPERATIONS.md: non-root, RuntimeDefault seccomp, no privilege
escalation, all capabilities dropped, read-only root, no host namespaces, no service account
token, and (for Deployments) startup, liveness and readiness probes and a zone spread; each
role reads its own Secret, and only migrate and the relay get the owner's (replication-capable)
database user.
Called by deploy/validate.sh; exits 1 naming each violation."""
import glob
import sys

import yaml

problems = []
docs = [(path, doc) for path in sorted(glob.glob("deploy/k8s/*.yaml"))
        for doc in yaml.safe_load_all(open(path)) if doc]
# The database user in each Secret's DATABASE_URL (postgres://USER:…@…).
secret_users = {
    doc["metadata"]["name"]: doc.get("stringData", {}).get("DATABASE_URL", "").split("//")[-1].split(":")[0]
    for _, doc in docs if doc.get("kind") == "Secret"
}
OWNER_ROLES = {"migrate", "relay"}
for path, doc in docs:
    if not doc or doc.get("kind") not in ("Deployment", "Job"):
        continue
    name = f"{path}: {doc['kind']} {doc['metadata']['name']}"
    pod = doc["spec"]["template"]["spec"]
    sc = pod.get("securityContext", {})
    def need(ok, what):
        if not ok:
            problems.append(f"{name}: {what}")
    need(sc.get("runAsNonRoot") is True, "pod runAsNonRoot must be true")
    need(sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", "pod seccompProfile must be RuntimeDefault")
    need(pod.get("automountServiceAccountToken") is False, "automountServiceAccountToken must be false")
    need(bool(pod.get("serviceAccountName")), "a dedicated serviceAccountName")
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        need(not pod.get(host), f"{host} must be off")
    for c in pod.get("containers", []) + pod.get("initContainers", []):
        csc = c.get("securityContext", {})
        cname = f"container {c['name']}"
        need(csc.get("allowPrivilegeEscalation") is False, f"{cname}: allowPrivilegeEscalation false")
        need(not csc.get("privileged"), f"{cname}: not privileged")
        need("ALL" in csc.get("capabilities", {}).get("drop", []), f"{cname}: drop ALL capabilities")
        need(not csc.get("capabilities", {}).get("add"), f"{cname}: add no capability")
        need(csc.get("readOnlyRootFilesystem") is True, f"{cname}: readOnlyRootFilesystem")
        if doc["kind"] == "Deployment":
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                need(probe in c, f"{cname}: {probe}")
        component = doc["metadata"]["labels"].get("app.kubernetes.io/component")
        secrets = [e["secretRef"]["name"] for e in c.get("envFrom", []) if "secretRef" in e]
        need(secrets == [f"railhook-{component}"], f"{cname}: reads only its role's Secret railhook-{component} (has {secrets})")
        for secret in secrets:
            user = secret_users.get(secret)
            need(user is not None, f"{cname}: Secret {secret} is not defined")
            if component in OWNER_ROLES:
                need(user == "railhook", f"{cname}: {secret} must connect as the owner railhook")
            else:
                need(user == "railhook_app", f"{cname}: {secret} must connect as railhook_app, not {user}")
    if doc["kind"] == "Deployment":
        keys = [t.get("topologyKey") for t in pod.get("topologySpreadConstraints", [])]
        need("topology.kubernetes.io/zone" in keys, "spread over zones")
if problems:
    print("\n".join(problems))
    sys.exit(1)
print("pod templates meet the restricted profile")
