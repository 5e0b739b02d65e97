#!/usr/bin/env bash
# validate.sh: checks the deployment files offline (no container engine or cluster here):
# the compose file against the Compose Specification schema, the Kubernetes manifests
# against the API schemas (strict: unknown fields fail), Prometheus' config and rules with
# promtool, the Dockerfile's stages by name, and new migrations against the rules for
# changing a live schema (check_migrations.py). Called by test.sh.
source "$(dirname "$0")/local/lib.sh"
cd "$ROOT"
if ! command -v check-jsonschema >/dev/null || ! command -v kubernetes-validate >/dev/null; then
  log "pip install check-jsonschema kubernetes-validate"
  python3 -m pip install --quiet check-jsonschema kubernetes-validate
fi
command -v promtool >/dev/null || apt_install prometheus
check-jsonschema --builtin-schema vendor.compose-spec deploy/docker-compose.yml
kubernetes-validate --strict --quiet --kubernetes-version 1.30 deploy/k8s/*.yaml deploy/k8s/examples/*.yaml
python3 deploy/k8s/check_restricted.py >/dev/null
python3 deploy/check_migrations.py --self-test >/dev/null
python3 deploy/check_migrations.py >/dev/null
promtool check config deploy/prometheus/prometheus.yml >/dev/null
(cd deploy/prometheus && promtool test rules alerts_test.yml >/dev/null)
# Every file the compose file mounts exists.
grep -oE '\./(prometheus|grafana)/[^:]+' deploy/docker-compose.yml | while read -r f; do
  [ -e "deploy/$f" ] || die "docker-compose.yml mounts deploy/$f, which does not exist"
done
grep -q '^FROM .* AS build$' Dockerfile && grep -q '^USER 10001' Dockerfile \
  || die "Dockerfile: expected a build stage and a non-root USER"
log "deployment files valid (compose schema, k8s 1.30 strict, restricted pod security, promtool rules and their tests, migration rules)"
