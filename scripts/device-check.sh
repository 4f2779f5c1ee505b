#!/usr/bin/env bash
# Issue 27's checks on a GPU machine with 16 cores, in one pass (each step bounded by `timeout`, each step's log
# kept under $OUT whatever the others do):
#   1. the CUDA tests (IMPALA, PPO and DQN learners and SEED's inference server on the GPU);
#   2. benchmarks/image_obs.py with 14 workers (goal 3: >= 0.7x the no-transport reference), batches onto the CPU
#      (image-obs) and onto the GPU (image-obs-cuda: frame stacks gathered there), py-spy recording the first's
#      learner for 30 s where installed ($OUT/image-obs-learner.txt);
#   3. benchmarks/pop_ahead.py with the conv update on the GPU, and benchmarks/weights_broadcast.py with 14 readers;
#   4. IMPALA on ALE/Pong-v5 with --learner-device cuda for PONG_SECONDS, then its learning curve; py-spy, where
#      installed, records the learner for 20 s of it (Python frames, $OUT/pong-learner.txt) and then its busiest
#      worker ($OUT/pong-worker.txt). PONG_ACTORS (224) and PONG_BATCH (32) set its envs and rollouts per batch.
#   5. (seed-frames, only when named in STEPS) benchmarks/request_frames.py with SEED's inference server on the
#      GPU: requests of whole stacks against the frames the server lacks, round trips and SEED on Pong.
# STEPS picks the steps by name (default: all but seed-frames).
# Run from the repository root. Where the machine has none of rqrl's dependencies, put their wheels in .whl/ (and a
# redis-server in .whl/redis/) first, with scripts/device-wheels.sh on a machine that reaches PyPI: this installs
# them into /tmp/site. QUICK=1 runs every step briefly on 2 workers
# (and the update on the CPU) to try the script on a machine without a GPU; INSTALL=0 skips the wheels.
set -u
OUT=${OUT:-/tmp/device-check}
PY=${PY:-python3}
QUICK=${QUICK:-0}
PONG_SECONDS=${PONG_SECONDS:-300}
STEPS=${STEPS:-cuda-tests image-obs image-obs-cuda pop-ahead weights pong}
CUDA_TESTS=${CUDA_TESTS:-tests/processes/test_impala_cuda.py tests/processes/test_ppo_cuda.py \
    tests/processes/test_dqn_cuda.py tests/integration/test_inference.py tests/unit/test_stack_gather.py}
ROUNDS=${ROUNDS:-2}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD" PATH="$PWD/.whl/redis:/tmp/site/bin:$PATH"

if [ "${INSTALL:-1}" = 1 ] && ls .whl/*.whl > /dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
"$PY" -c "import torch, gymnasium, ale_py, rq, redis; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
      'gymnasium', gymnasium.__version__, 'ale-py', ale_py.__version__, 'rq', rq.__version__)" || exit 1
echo "cores: $(nproc); redis-server: $(command -v redis-server) $(redis-server --version | cut -d' ' -f3)"

step() {  # step NAME SECONDS COMMAND...: run COMMAND into $OUT/NAME.log, stopped by SIGINT after SECONDS
    local name=$1 limit=$2 started rc
    shift 2
    case " $STEPS " in *" ${name%-curve} "*) ;; *) return ;; esac  # pong-curve goes with pong
    started=$(date +%s)
    echo "=== $name (at most $limit s): $*"
    timeout -s INT -k 20 "$limit" "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    echo "=== $name: exit $rc after $(( $(date +%s) - started )) s"
    tail -n "${TAIL:-25}" "$OUT/$name.log"
}

if [ "$QUICK" = 1 ]; then
    workers=2 seconds=1 obs_seconds=1 rounds=1 train=cpu pong_workers=2 pong_actors=16 device=cpu
else
    # image_obs: windows of 11 s, so the workers' time shares (published every 5 s) come from inside them
    workers=14 seconds=4 obs_seconds=11 rounds=$ROUNDS train=cuda pong_workers=14 pong_actors=${PONG_ACTORS:-224} device=cuda
fi

# shellcheck disable=SC2086  # CUDA_TESTS: test files, split on spaces
TAIL=8 step cuda-tests 150 "$PY" -m pytest -q -p no:cacheprovider --timeout 120 -k cuda $CUDA_TESTS
profile() {  # profile NAME PATTERN DELAY SECONDS [worker]: py-spy of the oldest process matching PATTERN (the learner),
    # in the background; with "worker", then of that process's busiest child for as long again
    command -v py-spy > /dev/null || return 0
    case " $STEPS " in *" $1 "*) ;; *) return 0 ;; esac
    (sleep "$3"; pid=$(pgrep -f -o "$2") || exit 0
     py-spy record --pid "$pid" --duration "$4" --rate 50 --format raw --output "$OUT/$1-learner.txt" > /dev/null 2>&1
     [ "${5:-}" = worker ] || exit 0
     # local workers are forked by multiprocessing's forkserver (or the learner itself): the busiest of them
     child=$(ps -eo pid=,pcpu=,args= --sort=-pcpu | awk -v learner="$pid" \
         '$1 != learner && /multiprocessing|rqrl train/ && !/awk/ {print $1; exit}') || exit 0
     py-spy record --pid "$child" --duration "$4" --rate 50 --format raw --output "$OUT/$1-worker.txt" \
        > /dev/null 2>&1) &
}

profile image-obs "^$PY benchmarks/image_obs.py" 5 30
TAIL=30 step image-obs 200 "$PY" benchmarks/image_obs.py --workers "$workers" --envs 8 32 --seconds "$obs_seconds" \
    --warmup 2 --rounds "$rounds"
TAIL=18 step image-obs-cuda 200 "$PY" benchmarks/image_obs.py --workers "$workers" --envs 8 32 --seconds "$obs_seconds" \
    --warmup 2 --rounds "$rounds" --learner-device "$device"
TAIL=16 step pop-ahead 120 "$PY" benchmarks/pop_ahead.py --workers "$workers" --train "$train" \
    --seconds "$seconds" --warmup 2 --rounds "$rounds"
TAIL=5 step weights 60 "$PY" benchmarks/weights_broadcast.py --readers "$workers" --seconds "$seconds"
TAIL=30 step seed-frames 300 "$PY" benchmarks/request_frames.py --threads 32 --steps 100 --seconds "$seconds" \
    --rounds "$rounds" --repeats 3 --device "$device" --seed-seconds $(( seconds * 2 ))
rm -rf /tmp/device-runs
profile pong "^$PY -m rqrl train impala" 60 20 worker  # the learner's profile a minute in, then a worker's
# stopped by SIGINT after PONG_SECONDS: the learner stops the workers, writes its last checkpoint and metrics
TAIL=6 step pong $(( PONG_SECONDS + 40 )) timeout -s INT "$PONG_SECONDS" "$PY" -m rqrl train impala --env ALE/Pong-v5 \
    --workers "$pong_workers" --n-actors "$pong_actors" --n-rollout-steps 32 --batch-size "${PONG_BATCH:-32}" \
    --learning-rate 6e-4 \
    --max-grad-norm 40 --learner-device "$device" --total-env-steps 50000000 --run-dir /tmp/device-runs \
    --run-name pong --progress-seconds 20 --metrics-seconds 5
cp /tmp/device-runs/pong/metrics.csv "$OUT/pong-metrics.csv" 2>/dev/null
TAIL=30 step pong-curve 60 "$PY" benchmarks/run_curve.py /tmp/device-runs/pong --window 30
# what comes back from a device run is at most 8 files: the curve goes with the run's log
[ -f "$OUT/pong-curve.log" ] && cat "$OUT/pong-curve.log" >> "$OUT/pong.log" && rm "$OUT/pong-curve.log"
exit 0
