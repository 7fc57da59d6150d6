# shellcheck shell=bash
# Shared steps of the cluster e2e scripts (sourced by kind.sh and gpu.sh; not run on its own).
#
# The two scenarios are the local e2e's (tests/e2e/test_local_e2e.py), on a real cluster with the real
# KubeRay, applying the same RLJob (rendered by e2e/local/manifest.py from examples/tiny_grpo_rljob.yaml):
#   scenario_succeeds  the job trains, checkpoints to S3 and ends Succeeded with its final step committed;
#   scenario_resume    the driver is killed after a checkpoint; attempt 2 resumes from that step and succeeds.
# Each assertion that fails prints what was expected, what was found, and the commands to look further.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
NS="${NS:-rljob-e2e}"
RLJ_TIMEOUT_S="${RLJ_TIMEOUT_S:-1200}"

log() { printf '\n==> %s\n' "$*" >&2; }
fail() { printf '\nFAILED: %s\n' "$*" >&2; exit 1; }

need() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null || fail "\`$tool\` is not on PATH; install it (see e2e/README.md)"
  done
  [[ -x "$PYTHON" ]] || fail "$PYTHON not found: run \`make install\` in $ROOT (or set PYTHON=...)"
}

rljob_field() {  # rljob_field NAME JSONPATH
  kubectl get rljob "$1" -n "$NS" -o "jsonpath=$2"
}

# wait_rljob NAME FIELD PATTERN: poll until status.FIELD (phase, attempt) matches the extended regex
# ^(PATTERN)$; stop early when the job is Failed or Invalid (unless that is what is awaited).
wait_rljob() {
  local name="$1" field="$2" pattern="$3" deadline=$((SECONDS + RLJ_TIMEOUT_S)) phase value
  while ((SECONDS < deadline)); do
    phase="$(rljob_field "$name" '{.status.phase}' 2>/dev/null || true)"
    value="$(rljob_field "$name" "{.status.$field}" 2>/dev/null || true)"
    if [[ "$value" =~ ^($pattern)$ ]]; then return 0; fi
    if [[ "$phase" == Failed || "$phase" == Invalid ]]; then
      kubectl describe rljob "$name" -n "$NS" >&2 || true
      fail "RLJob $name is $phase while waiting for status.$field to match $pattern"
    fi
    sleep 5
  done
  kubectl describe rljob "$name" -n "$NS" >&2 || true
  fail "timed out after ${RLJ_TIMEOUT_S}s waiting for RLJob $name: status.$field=$value, expected $pattern"
}

apply_job() {  # apply_job NAME STEPS [key=value ...]: the shared e2e RLJob, checkpointing under $CHECKPOINT_ROOT
  local name="$1" steps="$2"
  shift 2
  (cd "$ROOT" && "$PYTHON" -m e2e.local.manifest "$name" --inputs /home/ray/demo \
      --checkpoint-uri "$CHECKPOINT_ROOT/$name" --secret s3-credentials --image "$E2E_IMAGE" \
      "trainer.total_training_steps=$steps" trainer.save_freq=2 "$@") \
    | kubectl apply -n "$NS" -f -
}

verify() {  # verify ARGS...: e2e/cluster/verify.py with the S3 variables of the host side ($HOST_S3_ENV)
  (cd "$ROOT" && env "${HOST_S3_ENV[@]}" "$PYTHON" -m e2e.cluster.verify "$@")
}

create_s3_secret() {  # create_s3_secret KEY=VALUE...: the Secret spec.checkpoint.secretRef names
  local args=() kv
  for kv in "$@"; do args+=("--from-literal=$kv"); done
  kubectl create secret generic s3-credentials -n "$NS" "${args[@]}" --dry-run=client -o yaml | kubectl apply -f -
}

expect_row() {  # expect_row NAME PHASE ATTEMPT: `kubectl get rljobs` shows them (printer columns)
  local row
  row="$(kubectl get rljobs -n "$NS" --no-headers | awk -v n="$1" '$1 == n')"
  echo "$row"
  [[ "$(awk '{print $2}' <<<"$row")" == "$2" ]] || fail "kubectl get rljobs: $1 is not $2: $row"
  kubectl get rljob "$1" -n "$NS" -o jsonpath='{.status.attempt}' | grep -qx "$3" \
    || fail "RLJob $1: status.attempt is not $3"
}

scenario_succeeds() {  # scenario_succeeds NAME [key=value ...]
  local name="$1"
  shift
  log "scenario 1: $name trains 3 steps, checkpoints to $CHECKPOINT_ROOT/$name and succeeds"
  apply_job "$name" 3 "$@"
  wait_rljob "$name" phase 'Running|Succeeded'
  kubectl get rljobs -n "$NS"
  wait_rljob "$name" phase Succeeded
  expect_row "$name" Succeeded 1
  kubectl get rayjob "$name-a1" -n "$NS" -o jsonpath='{.status.jobDeploymentStatus}/{.status.jobStatus}' \
    | grep -qx 'Complete/SUCCEEDED' || fail "RayJob $name-a1 is not Complete/SUCCEEDED"
  verify "$CHECKPOINT_ROOT/$name" --committed 3 || fail "final checkpoint of $name not committed (see above)"
}

kill_driver() {  # kill_driver RAYJOB: SIGKILL the trainer driver in the head pod (a crash, like the local e2e)
  local cluster pod
  cluster="$(kubectl get rayjob "$1" -n "$NS" -o jsonpath='{.status.rayClusterName}')"
  pod="$(kubectl get pods -n "$NS" -l "ray.io/cluster=$cluster,ray.io/node-type=head" -o name | head -n1)"
  [[ -n "$pod" ]] || fail "no head pod for RayCluster $cluster of RayJob $1"
  kubectl exec -n "$NS" "$pod" -c ray-head -- python -c '
import psutil
killed = [p.kill() or p.pid for p in psutil.process_iter(["cmdline"])
          if "hybridflow.trainer.main_ppo" in " ".join(p.info["cmdline"] or [])]
assert killed, "no trainer driver process in the head pod"
print("killed driver", killed)'
}

scenario_resume() {  # scenario_resume NAME [key=value ...]
  local name="$1" total=20 resumed_from
  shift
  log "scenario 2: $name is killed after its first checkpoint; attempt 2 resumes from it and succeeds"
  apply_job "$name" "$total" "$@"
  resumed_from="$(verify "$CHECKPOINT_ROOT/$name" --wait-latest "$RLJ_TIMEOUT_S")" \
    || fail "$name never committed a checkpoint"
  kill_driver "$name-a1"
  resumed_from="$(verify "$CHECKPOINT_ROOT/$name" --wait-latest 5)"  # the driver is dead: this is final
  log "attempt 1 killed; latest committed step: $resumed_from"
  wait_rljob "$name" attempt 2  # the operator's retry
  wait_rljob "$name" phase Succeeded
  expect_row "$name" Succeeded 2
  # KubeRay's submitter Job (named after the RayJob) follows the driver's output.
  kubectl logs -n "$NS" "job/$name-a2" | grep -F "resumed from $CHECKPOINT_ROOT/$name/global_step_$resumed_from (global step $resumed_from)" \
    || fail "attempt 2 did not resume from step $resumed_from (kubectl logs -n $NS job/$name-a2)"
  verify "$CHECKPOINT_ROOT/$name" --committed "$total" || fail "final checkpoint of $name not committed"
}
