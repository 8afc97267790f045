#!/usr/bin/env bash
# The GPU benchmark (bench_gpu_trainer.py) as ONE command on a lent GPU machine, and the wheels
# it needs there. See docs/gpu-training.md ("Running the benchmark").
#
#   1. here, in the repository root, once (needs pip and PyPI; writes .whl/, ignored by git):
#        bash tests/benchmarks/gpu_device_check.sh wheels
#   2. on the device, one call (the device tool's `run`), well inside 10 minutes:
#        command:   bash tests/benchmarks/gpu_device_check.sh
#        carry:     [".whl"]
#        timeout_s: 480
#      It brings back $OUT/log.txt and $OUT/lora7b.json, $OUT/full1.5b.json (the figures).
#
# Why wheels: the device machine has torch, transformers, peft, accelerate, safetensors and
# tokenizers, and no network. The bench imports the trainer (trainer/grpo.py, trainer/policy.py),
# whose imports reach pydantic (engine/contracts/training.py) and structlog
# (trainer/policy.py `base_model_dir` -> engine/providers/local/): those two and pydantic's own
# needs travel as wheels, at the versions this checkout's environment uses. Nothing else of the
# engine's dependencies is imported (checked on the CPU by blocking every other package).
#
# The project is not pip-installed there: the folders are linked into a `conductor_engine`
# namespace under /tmp/site (what setup.py's package_dir does), which PYTHONPATH then holds.
#
# Time (device minutes are scarce): each shape runs in its own process under `timeout`
# (LORA7B_S, FULL15B_S seconds), so one shape that runs out of memory or time leaves the other's
# figures. The random models are kept in /tmp/bench-gpu-models: a rerun on the same warm machine
# skips building them.
set -uo pipefail
cd "$(dirname "$0")/../.."

WHEELS=(pydantic pydantic-core annotated-types typing-inspection typing-extensions structlog)

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
LORA7B_S=${LORA7B_S:-270}
FULL15B_S=${FULL15B_S:-120}
started=$(date +%s)
say() { echo "== $*" | tee -a "$LOG"; }

SITE=${BENCH_SITE:-/tmp/site}
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl 2>&1 | tee -a "$LOG" || { say "installing .whl failed"; exit 1; }
else
  say "no .whl/ here: run 'bash tests/benchmarks/gpu_device_check.sh wheels' first and carry .whl"
fi
mkdir -p "$SITE/conductor_engine"
for folder in engine activities workflows trainer; do
  ln -sfn "$PWD/$folder" "$SITE/conductor_engine/$folder"
done
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

say "machine"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import torch, transformers, peft, pydantic; print("torch", torch.__version__,
"transformers", transformers.__version__, "peft", peft.__version__, "pydantic",
pydantic.__version__, "cuda", torch.cuda.is_available())'
  python3 -c 'import conductor_engine.trainer.grpo, conductor_engine.trainer.policy;
print("trainer imports ok")'
  git log -1 --format='commit %h %s' 2>/dev/null || true
} 2>&1 | tee -a "$LOG"

status=0
for shape in lora7b full1.5b; do
  limit=$LORA7B_S; [[ $shape == full1.5b ]] && limit=$FULL15B_S
  say "$shape (at most ${limit} s)"
  # shellcheck disable=SC2086  # BENCH_ARGS: extra flags, e.g. --small for a dry run on a CPU
  timeout "$limit" python3 tests/benchmarks/bench_gpu_trainer.py --shape "$shape" \
    --cache-dir /tmp/bench-gpu-models --json "$OUT/$shape.json" ${BENCH_ARGS:-} 2>&1 | tee -a "$LOG"
  rc=$?
  [[ $rc -eq 0 ]] || { say "$shape exited $rc (124: timed out)"; status=1; }
  nvidia-smi --query-gpu=memory.used --format=csv,noheader 2>&1 | tee -a "$LOG"
done
say "done in $(( $(date +%s) - started )) s; figures and log in $OUT"
exit $status
