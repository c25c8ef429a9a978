#!/usr/bin/env bash
# Validates the generated CRDs (manifests/crds/*.yaml) against the Kubernetes
# API schemas of the oldest and the newest Kubernetes dpufs supports, with
# kubernetes-validate --strict (unknown fields are errors). Installs the tool
# into a virtualenv at .ci/.venv on first use; later runs reuse it.
set -euo pipefail
cd "$(dirname "$0")/.."

KUBERNETES_VALIDATE=1.37.0
KUBERNETES_VERSIONS=(1.33.0 1.36.0)
VENV=.ci/.venv

installed() {
  "$VENV/bin/python" -c \
    'import importlib.metadata as m; print(m.version("kubernetes-validate"))' 2>/dev/null
}
if [ "$(installed || true)" != "$KUBERNETES_VALIDATE" ]; then
  echo "installing kubernetes-validate==$KUBERNETES_VALIDATE into $VENV"
  python3 -m venv "$VENV"
  echo '*' >"$VENV/.gitignore" # keep the virtualenv out of git
  "$VENV/bin/pip" install -q --disable-pip-version-check "kubernetes-validate==$KUBERNETES_VALIDATE"
fi

shopt -s nullglob
crds=(manifests/crds/*.yaml)
if ((${#crds[@]} == 0)); then
  echo "no CRDs in manifests/crds; generate them with: cargo run -p dpufs-operator -- crds --out manifests/crds" >&2
  exit 1
fi

for version in "${KUBERNETES_VERSIONS[@]}"; do
  echo "kubernetes-validate --strict -k $version: ${crds[*]}"
  "$VENV/bin/kubernetes-validate" --strict -k "$version" "${crds[@]}"
done
echo "CRDs valid for Kubernetes ${KUBERNETES_VERSIONS[*]}"
