#!/usr/bin/env bash
# Cluster e2e on kind (CPU only): KubeRay + the rljob-operator chart + MinIO, then the two scenarios of
# e2e/cluster/lib.sh with the same RLJob the local e2e applies. See e2e/README.md.
#
#   e2e/cluster/kind.sh                 # create the cluster, build and load the images, run, delete the cluster
#   KEEP=1 e2e/cluster/kind.sh          # keep the cluster afterwards (inspect with kubectl -n rljob-e2e ...)
#   SKIP_BUILD=1 IMAGE=... TAG=... e2e/cluster/kind.sh   # use images already built (e.g. by `make images`)
#
# Needs: docker, kind, kubectl, helm (or the repo's .venv/bin/{kubectl,helm}), `make install` done, and a
# Docker engine with >= 4 CPUs and >= 16 GiB of memory (the example asks for a 2-CPU/8Gi worker + 1/4Gi head).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=e2e/cluster/lib.sh
source "$HERE/lib.sh"
PATH="$ROOT/.venv/bin:$PATH"  # the repo's kubectl/helm when none is installed

CLUSTER="${CLUSTER:-rljob-e2e}"
IMAGE="${IMAGE:-localhost/rljob-hybridflow}"
TAG="${TAG:-e2e}"
KUBERAY_VERSION="${KUBERAY_VERSION:-1.7.0}"
E2E_IMAGE="$IMAGE/trainer-e2e:$TAG"
CHECKPOINT_ROOT="s3://rljob-e2e/runs"
MINIO_PORT="${MINIO_PORT:-19000}"

need docker kind kubectl helm

cleanup() {
  if [[ -n "${PORT_FORWARD_PID:-}" ]]; then kill "$PORT_FORWARD_PID" 2>/dev/null || true; fi
  if [[ "${KEEP:-0}" != 1 ]]; then kind delete cluster --name "$CLUSTER" || true; fi
}
trap cleanup EXIT

log "kind cluster $CLUSTER"
kind get clusters | grep -qx "$CLUSTER" || kind create cluster --name "$CLUSTER" --wait 120s
kubectl config use-context "kind-$CLUSTER"

if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
  log "images (operator, trainer with vLLM) as $IMAGE/*:$TAG"
  docker build -f "$ROOT/operator/Dockerfile" -t "$IMAGE/operator:$TAG" "$ROOT"
  docker build -f "$ROOT/trainer_image/Dockerfile" --build-arg ROLLOUT=vllm -t "$IMAGE/trainer:$TAG" "$ROOT"
fi
docker build -f "$HERE/Dockerfile.e2e" --build-arg "TRAINER_IMAGE=$IMAGE/trainer:$TAG" -t "$E2E_IMAGE" "$HERE"
kind load docker-image --name "$CLUSTER" "$IMAGE/operator:$TAG" "$E2E_IMAGE"

log "KubeRay $KUBERAY_VERSION"
helm repo add kuberay https://ray-project.github.io/kuberay-helm/ >/dev/null
helm repo update kuberay >/dev/null
helm upgrade --install kuberay-operator kuberay/kuberay-operator --version "$KUBERAY_VERSION" \
  -n kuberay-system --create-namespace --wait --timeout 5m

log "rljob-operator chart"
helm upgrade --install rljob "$ROOT/helm/rljob-operator" -n rljob-system --create-namespace \
  --set "image.repository=$IMAGE/operator" --set "image.tag=$TAG" --set image.pullPolicy=IfNotPresent \
  --set operator.resyncSeconds=10 --wait --timeout 5m
kubectl get crd rljobs.rl.hybridflow.dev >/dev/null || fail "the chart did not install the RLJob CRD"

log "MinIO (S3) in namespace $NS"
kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f -
kubectl apply -n "$NS" -f "$HERE/minio.yaml"
kubectl rollout status -n "$NS" deployment/minio --timeout 5m
kubectl wait -n "$NS" --for=condition=complete job/minio-bucket --timeout 5m
create_s3_secret AWS_ACCESS_KEY_ID=rljob-e2e AWS_SECRET_ACCESS_KEY=rljob-e2e-secret \
  AWS_DEFAULT_REGION=us-east-1 "AWS_ENDPOINT_URL=http://minio.$NS.svc:9000"
kubectl port-forward -n "$NS" svc/minio "$MINIO_PORT:9000" >/dev/null &
PORT_FORWARD_PID=$!
HOST_S3_ENV=(AWS_ACCESS_KEY_ID=rljob-e2e AWS_SECRET_ACCESS_KEY=rljob-e2e-secret AWS_DEFAULT_REGION=us-east-1
             "AWS_ENDPOINT_URL=http://127.0.0.1:$MINIO_PORT")

scenario_succeeds e2e-tiny
scenario_resume e2e-resume
log "kind e2e passed"
