#!/usr/bin/env bash
# The GPU benchmarks (bench_gpu_trainer.py: the trainer's update; bench_rollouts.py: the local
# provider's rollouts; bench_gpu_iteration.py: a whole training iteration, rollouts to pick-up)
# as ONE command on a lent GPU machine, and the wheels they need there. See docs/how-to/gpu-training.md
# ("Running the benchmark", "Rollouts on the GPU", "One iteration on one GPU").
#
#   1. here, in the repository root, once (needs pip and PyPI; writes .whl/, ignored by git):
#        bash tests/benchmarks/gpu_device_check.sh wheels
#   2. on the device, one call (the device tool's `run`), well inside 10 minutes:
#        command:   bash tests/benchmarks/gpu_device_check.sh
#        carry:     [".whl"]
#        timeout_s: 480
#      It brings back $OUT/log.txt and $OUT/lora7b.json, $OUT/roll7b.json, $OUT/full1.5b.json,
#      $OUT/roll1.5b.json (the figures). The whole iteration is a call of its own (it needs
#      about four minutes: two iterations, the first compiling the decode step):
#        command:   ONLY=iter7b bash tests/benchmarks/gpu_device_check.sh      (timeout_s 480)
#      which brings back $OUT/iter7b.json.
#
# Why wheels: the device machine has torch, transformers, peft, accelerate, safetensors and
# tokenizers, and no network. The trainer bench imports the trainer (trainer/grpo/,
# trainer/policy.py), whose imports reach pydantic (engine/contracts/training.py) and structlog
# (trainer/policy.py `base_model_dir` -> engine/providers/local/); the rollout bench imports the
# local provider, which adds xgrammar (the plan grammar) and xgrammar's apache-tvm-ffi. Those and
# pydantic's own needs travel as wheels, at the versions this checkout's environment uses.
# Nothing else of the engine's dependencies is imported (checked on the CPU by blocking every
# other package: BLOCKED_MODULES below).
#
# The project is not pip-installed there: the folders are linked into a `conductor_engine`
# namespace under /tmp/site (what setup.py's package_dir does), which PYTHONPATH then holds.
#
# Time (device minutes are scarce): each run is its own process under `timeout` (LORA7B_S,
# ROLL7B_S, FULL15B_S, ROLL15B_S, ITER7B_S seconds), so one that runs out of memory or time
# leaves the others' figures. The random models are kept in /tmp/bench-gpu-models: the rollout runs reuse the
# trainer runs' model directories (lora7b builds the 7B one, roll7b runs next on it), and a rerun
# on the same warm machine skips building them.
#
# Dry run on a CPU: BENCH_ARGS=--small (both benches take it) runs the tiny shapes; to check
# the imports as the device has them, list the modules it lacks in BLOCKED_MODULES and put a
# sitecustomize.py that refuses them on PYTHONPATH (see docs/how-to/gpu-training.md).
set -uo pipefail
cd "$(dirname "$0")/../.."

WHEELS=(pydantic pydantic-core annotated-types typing-inspection typing-extensions structlog
        xgrammar apache-tvm-ffi)

if [[ "${1:-}" == "wheels" ]]; then
  set -e
  PY=${PYTHON:-python}
  exclude=$(git rev-parse --git-path info/exclude)
  grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
  mkdir -p .whl
  for name in "${WHEELS[@]}"; do
    version=$("$PY" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$name")
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      --platform manylinux1_x86_64 -d .whl "$name==$version"
  done
  ls -la .whl
  exit 0
fi

OUT=${OUT:-$(mktemp -d /tmp/bench-gpu-out.XXXX)}  # the device tool sets OUT; elsewhere a temp dir
mkdir -p "$OUT"
LOG="$OUT/log.txt"
LORA7B_S=${LORA7B_S:-190}
ROLL7B_S=${ROLL7B_S:-100}
FULL15B_S=${FULL15B_S:-100}
ROLL15B_S=${ROLL15B_S:-60}
ITER7B_S=${ITER7B_S:-420}
started=$(date +%s)
say() { echo "== $*" | tee -a "$LOG"; }

SITE=${BENCH_SITE:-/tmp/site}
if [[ -n "${BENCH_NO_WHEELS:-}" ]]; then  # a dry run on a machine that has the packages
  say "BENCH_NO_WHEELS set: using this Python's own packages"
elif compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl 2>&1 | tee -a "$LOG" || { say "installing .whl failed"; exit 1; }
else
  say "no .whl/ here: run 'bash tests/benchmarks/gpu_device_check.sh wheels' first and carry .whl"
fi
mkdir -p "$SITE/conductor_engine"
for folder in engine activities workflows trainer runtime conductor_engine/__init__.py; do
  ln -sfn "$PWD/$folder" "$SITE/conductor_engine/${folder#conductor_engine/}"
done
# The benches run as modules (`python3 -m tests.benchmarks.NAME`): the checkout gives `tests`,
# and PYTHONSAFEPATH keeps the working directory off the front of sys.path, where its
# conductor_engine/ (the package's face, without the folders) would hide the one in $SITE.
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONSAFEPATH=1 PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

say "machine"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import torch, transformers, peft, pydantic; print("torch", torch.__version__,
"transformers", transformers.__version__, "peft", peft.__version__, "pydantic",
pydantic.__version__, "cuda", torch.cuda.is_available())'
  python3 -c 'import conductor_engine.trainer.grpo, conductor_engine.trainer.policy;
print("trainer imports ok")'
  python3 -c 'import importlib.metadata, xgrammar, conductor_engine.engine.providers.local.batching;
print("xgrammar", importlib.metadata.version("xgrammar"), "local provider imports ok")'
  git log -1 --format='commit %h %s' 2>/dev/null || true
} 2>&1 | tee -a "$LOG"

status=0
run() {  # run NAME LIMIT COMMAND...: one benchmark process under its own time limit
  local name=$1 limit=$2; shift 2
  [[ -z "${ONLY:-}" || " $ONLY " == *" $name "* ]] || return 0  # ONLY="lora7b roll7b": a subset
  say "$name (at most ${limit} s)"
  timeout "$limit" "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  [[ $rc -eq 0 ]] || { say "$name exited $rc (124: timed out)"; status=1; }
  nvidia-smi --query-gpu=memory.used --format=csv,noheader 2>&1 | tee -a "$LOG"
}
CACHE=/tmp/bench-gpu-models
# shellcheck disable=SC2086  # BENCH_ARGS: flags for every bench (--small: a dry run on a CPU);
# TRAIN_ARGS: the trainer bench only (--gradient-checkpointing off); ROLL_ARGS: the rollout bench;
# ITER_ARGS: the iteration bench. iter7b runs only when ONLY names it (see the top).
{
run lora7b "$LORA7B_S" python3 -m tests.benchmarks.bench_gpu_trainer --shape lora7b \
  --cache-dir $CACHE --json "$OUT/lora7b.json" ${BENCH_ARGS:-} ${TRAIN_ARGS:-}
run roll7b "$ROLL7B_S" python3 -m tests.benchmarks.bench_rollouts --shape 7b \
  --cache-dir $CACHE --json "$OUT/roll7b.json" ${BENCH_ARGS:-} ${ROLL_ARGS:-}
run full1.5b "$FULL15B_S" python3 -m tests.benchmarks.bench_gpu_trainer --shape full1.5b \
  --cache-dir $CACHE --json "$OUT/full1.5b.json" ${BENCH_ARGS:-} ${TRAIN_ARGS:-}
run roll1.5b "$ROLL15B_S" python3 -m tests.benchmarks.bench_rollouts --shape 1.5b \
  --cache-dir $CACHE --json "$OUT/roll1.5b.json" ${BENCH_ARGS:-} ${ROLL_ARGS:-}
[[ " ${ONLY:-} " == *" iter7b "* ]] && run iter7b "$ITER7B_S" python3 -m \
  tests.benchmarks.bench_gpu_iteration --cache-dir $CACHE --json "$OUT/iter7b.json" \
  ${BENCH_ARGS:-} ${ITER_ARGS:-}
}
# One GPU for both (docs/how-to/gpu-training.md): the trainer's peak and the provider's bf16 copy's
python3 - "$OUT" <<'PY' 2>&1 | tee -a "$LOG"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
def read(name):
    try:
        return json.loads((out / name).read_text())
    except (OSError, ValueError):
        return None
for trainer, roll in (("lora7b", "roll7b"), ("full1.5b", "roll1.5b")):
    t, r = read(f"{trainer}.json"), read(f"{roll}.json")
    if t is None and r is None:  # neither ran (ONLY named others)
        continue
    shape = ((t or {}).get("shapes") or {}).get(trainer) or {}
    peak = shape.get("update_peak_bytes")
    if r and r.get("ours_peak_gib") and peak:
        print(f"one GPU, {trainer} + {roll}: trainer peak {peak / 2**30:.1f} GiB + provider "
              f"peak {r['ours_peak_gib']:.1f} GiB = {peak / 2**30 + r['ours_peak_gib']:.1f} GiB")
    else:
        print(f"one GPU, {trainer} + {roll}: figures missing ({sorted(shape)[:12]})")
PY
say "done in $(( $(date +%s) - started )) s; figures and log in $OUT"
exit $status
