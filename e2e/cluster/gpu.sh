#!/usr/bin/env bash
# Cluster e2e on a GPU cluster (the current kubectl context): the chart (and KubeRay when asked), then
# the two scenarios of e2e/cluster/lib.sh with the same RLJob as the local e2e, trained on GPUs
# (trainer.device=cuda, $GPUS GPUs per worker node). See e2e/README.md.
#
#   REGISTRY=registry.example.com/team CHECKPOINT_ROOT=s3://my-bucket/rljob-e2e \
#   AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... [AWS_ENDPOINT_URL=...] e2e/cluster/gpu.sh
#
# Options (environment): GPUS (default 1), INSTALL_KUBERAY=1 (install KubeRay's chart), SKIP_BUILD=1
# (images already pushed as $REGISTRY/{operator,trainer,trainer-e2e}:$TAG), TAG, NS. The S3 credentials go into the Secret the RLJob references and are used from
# this machine to check the checkpoints, so the bucket must be reachable from both.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=e2e/cluster/lib.sh
source "$HERE/lib.sh"

: "${REGISTRY:?set REGISTRY to an image registry prefix the cluster can pull from}"
: "${CHECKPOINT_ROOT:?set CHECKPOINT_ROOT to s3://bucket/prefix (the bucket must exist)}"
: "${AWS_ACCESS_KEY_ID:?set AWS_ACCESS_KEY_ID (and AWS_SECRET_ACCESS_KEY) for the checkpoint bucket}"
: "${AWS_SECRET_ACCESS_KEY:?set AWS_SECRET_ACCESS_KEY for the checkpoint bucket}"
TAG="${TAG:-e2e}"
GPUS="${GPUS:-1}"
KUBERAY_VERSION="${KUBERAY_VERSION:-1.7.0}"
E2E_IMAGE="$REGISTRY/trainer-e2e:$TAG"

need docker kubectl helm

if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
  log "images to $REGISTRY (operator, trainer with vLLM, trainer-e2e with the job's inputs)"
  docker build -f "$ROOT/operator/Dockerfile" -t "$REGISTRY/operator:$TAG" "$ROOT"
  docker build -f "$ROOT/trainer_image/Dockerfile" --build-arg ROLLOUT=vllm -t "$REGISTRY/trainer:$TAG" "$ROOT"
  docker build -f "$HERE/Dockerfile.e2e" --build-arg "TRAINER_IMAGE=$REGISTRY/trainer:$TAG" -t "$E2E_IMAGE" "$HERE"
  for image in operator trainer trainer-e2e; do docker push "$REGISTRY/$image:$TAG"; done
fi

if [[ "${INSTALL_KUBERAY:-0}" == 1 ]]; then
  log "KubeRay $KUBERAY_VERSION"
  helm repo add kuberay https://ray-project.github.io/kuberay-helm/ >/dev/null
  helm repo update kuberay >/dev/null
  helm upgrade --install kuberay-operator kuberay/kuberay-operator --version "$KUBERAY_VERSION" \
    -n kuberay-system --create-namespace --wait --timeout 5m
fi
kubectl get crd rayjobs.ray.io >/dev/null || fail "KubeRay is not installed (no rayjobs.ray.io CRD): rerun with INSTALL_KUBERAY=1"

log "rljob-operator chart"
helm upgrade --install rljob "$ROOT/helm/rljob-operator" -n rljob-system --create-namespace \
  --set "image.repository=$REGISTRY/operator" --set "image.tag=$TAG" --set operator.resyncSeconds=10 \
  --wait --timeout 5m

kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f -
secret=("AWS_ACCESS_KEY_ID=$AWS_ACCESS_KEY_ID" "AWS_SECRET_ACCESS_KEY=$AWS_SECRET_ACCESS_KEY"
        "AWS_DEFAULT_REGION=${AWS_DEFAULT_REGION:-us-east-1}")
[[ -n "${AWS_ENDPOINT_URL:-}" ]] && secret+=("AWS_ENDPOINT_URL=$AWS_ENDPOINT_URL")
create_s3_secret "${secret[@]}"
HOST_S3_ENV=("${secret[@]}")

ON_GPU=(trainer.device=cuda "trainer.n_gpus_per_node=$GPUS")
scenario_succeeds e2e-gpu "${ON_GPU[@]}"
requested="$(kubectl get rayjob e2e-gpu-a1 -n "$NS" \
  -o 'jsonpath={.spec.rayClusterSpec.workerGroupSpecs[0].template.spec.containers[0].resources.limits.nvidia\.com/gpu}')"
[[ "$requested" == "$GPUS" ]] || fail "the worker pods asked for '$requested' nvidia.com/gpu, expected $GPUS"
scenario_resume e2e-gpu-resume "${ON_GPU[@]}"
log "GPU e2e passed"
