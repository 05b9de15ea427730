#!/usr/bin/env bash
# The one prepared GPU check of the cupy backend: run it on a machine with an NVIDIA GPU, from the repository
# root or anywhere:
#
#     bash benchmarks/gpu_check.sh
#
# What it does, each step under its own time limit (the whole run stays under GPU_CHECK_BUDGET_S, default 460 s,
# so that one hanging step cannot eat the others' time):
#   1. records the machine (nvidia-smi, Python, NumPy, CuPy, PyTorch versions);
#   2. installs what is missing (soxr, tokenizers, pytest, hypothesis; for the official side by side
#      transformers==4.57.3, accelerate, einops, librosa, soundfile and qwen-tts 0.1.1 without its
#      dependencies) from the wheels folder benchmarks/gpu_wheels/ with pip --no-index: the GPU machine may
#      have no network.  refimpl itself always runs from this source tree (PYTHONPATH);
#   3. writes the full-size synthetic speech tokenizer (benchmarks/common.py; about 30 s on 2 cores), then
#      starts writing the 0.6B CustomVoice model in the background (about 3.5 min on 2 cores with a slow
#      disk; far less on a 16-core machine) while the tests run;
#   4. python -m pytest -m cuda (tests/backends/test_cuda.py: every twin on the device, every parity module on the
#      cupy backend in float32 and float64, streaming = one pass, greedy codes equal to the CPU, the decode
#      speed printed);
#   5. python benchmarks/bench_gpu.py: decode / encode / end-to-end timings in float32 and float64, and the
#      official qwen-tts on the same GPU when it and a CUDA PyTorch are importable;
#   6. a short summary.
# Results: under $OUT when it is set (the device tool's output folder), else gpu-results/ in the repository:
#   gpu_check.log (everything printed), steps.txt (step, exit status, seconds), cuda_tests.xml (JUnit),
#   bench_gpu.json (the measurements), summary.txt.
#
# Filling the wheels folder (on a machine WITH network, same Python version and platform as the GPU machine;
# benchmarks/gpu_wheels/ is git-ignored):
#
#     pip download --dest benchmarks/gpu_wheels soxr tokenizers pytest hypothesis \
#         transformers==4.57.3 accelerate einops librosa soundfile
#     pip download --dest benchmarks/gpu_wheels --no-deps qwen-tts==0.1.1
#
# (from another machine add  --only-binary=:all: --python-version 3.X --platform manylinux2014_x86_64).
# Leave out the wheels of what the GPU machine already has (NumPy, SciPy, Numba, PyTorch, CuPy usually): the
# folder travels with the working tree, and a tool that copies it may limit its size (the project's device
# tool carries at most 64 MiB: name the folder in its carry list).
# Without the folder, or when pip cannot install, the check runs with what the machine has: the tests skip
# what they cannot run, and the official side by side is skipped, each saying why.
#
# Environment: PYTHON (default python3), OUT (results folder), REFIMPL_BENCH_DIR (checkpoints, default
# bench-checkpoints/), GPU_WHEELS (default benchmarks/gpu_wheels), GPU_CHECK_BUDGET_S (default 460).

set -u
cd "$(dirname "$0")/.." || exit 1
REPO=$(pwd)
PY=${PYTHON:-python3}
RESULTS=${OUT:-$REPO/gpu-results}
WHEELS=${GPU_WHEELS:-$REPO/benchmarks/gpu_wheels}
BUDGET=${GPU_CHECK_BUDGET_S:-460}
export REFIMPL_BENCH_DIR=${REFIMPL_BENCH_DIR:-$REPO/bench-checkpoints}
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
mkdir -p "$RESULTS" "$REFIMPL_BENCH_DIR"
: > "$RESULTS/steps.txt"
exec > >(tee -a "$RESULTS/gpu_check.log") 2>&1

# step NAME LIMIT_S COMMAND...: run COMMAND (a program: a function of this script goes through bash -c) under
# min(LIMIT_S, what is left of the budget minus 15 s)
step() {
    local name=$1 limit=$2 left start rc
    shift 2
    left=$((BUDGET - SECONDS - 15))
    if [ "$left" -lt "$limit" ]; then limit=$left; fi
    if [ "$limit" -le 5 ]; then
        echo "=== $name: SKIPPED, the budget of $BUDGET s is spent"
        echo "$name skipped 0" >> "$RESULTS/steps.txt"
        return 0
    fi
    echo "=== $name (limit $limit s, $SECONDS s elapsed)"
    start=$SECONDS
    timeout -k 10 "$limit" "$@"
    rc=$?
    [ "$rc" -eq 124 ] && echo "=== $name: TIMED OUT after $limit s"
    echo "=== $name: exit $rc in $((SECONDS - start)) s"
    echo "$name $rc $((SECONDS - start))" >> "$RESULTS/steps.txt"
    return 0
}

machine() {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | head -5
    "$PY" - <<'EOF'
import importlib, os, platform, sys
print(f"python {sys.version.split()[0]} on {platform.machine()}, {os.cpu_count()} cpus")
for name in ("numpy", "scipy", "numba", "cupy", "soxr", "tokenizers", "pytest", "hypothesis", "torch",
             "transformers", "qwen_tts"):
    try:
        module = importlib.import_module(name)
        print(f"  {name} {getattr(module, '__version__', '?')}")
    except Exception as e:
        print(f"  {name}: not importable ({type(e).__name__}: {e})")
try:
    import torch
    print(f"  torch.cuda.is_available() = {torch.cuda.is_available()}")
except Exception:
    pass
from refimpl.backends import cupy_cuda
try:
    print(f"  cupy backend: {cupy_cuda.available()}")
except cupy_cuda.BackendUnavailable as e:
    print(f"  cupy backend UNAVAILABLE: {e}")
EOF
}

pip_install() {  # pip_install [pip options] PACKAGES...: from the wheels folder only; --user where needed
    "$PY" -m pip install --no-index --find-links "$WHEELS" --disable-pip-version-check "$@" \
        || "$PY" -m pip install --user --no-index --find-links "$WHEELS" --disable-pip-version-check "$@"
}

install_from_wheels() {
    if ! ls "$WHEELS"/*.whl > /dev/null 2>&1; then
        echo "no wheels in ${WHEELS#"$REPO"/}: running with what this machine has (refimpl from the source tree)"
        return 0
    fi
    local package
    for package in scipy soxr tokenizers pytest hypothesis; do   # one by one: one missing wheel stops no other
        "$PY" -c "import $package" 2> /dev/null || pip_install "$package" || echo "could not install $package"
    done
    pip_install "transformers==4.57.3" accelerate einops librosa soundfile \
        || echo "could not install the official package's dependencies: no side by side"
    pip_install --no-deps "qwen-tts==0.1.1" || echo "could not install qwen-tts: no side by side"
}

export PY WHEELS REPO
export -f machine pip_install install_from_wheels   # run by "timeout ... bash -c NAME" below
echo "GPU check of the cupy backend, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), results in $RESULTS"
step machine 60 bash -c machine
step install 90 bash -c install_from_wheels
step speech_tokenizer 120 "$PY" -c \
    "import sys; sys.path.insert(0, 'benchmarks'); import common; print(common.released_speech_tokenizer())"
MODEL_DIR="$REFIMPL_BENCH_DIR/released-0.6b-customvoice"
( timeout -k 10 300 "$PY" -c \
      "import sys; sys.path.insert(0, 'benchmarks'); import common; print(common.released_custom_voice_0_6b())" \
      > "$RESULTS/build_0_6b.log" 2>&1
  echo $? > "$RESULTS/build_0_6b.rc" ) &
BUILD=$!
step cuda_tests 220 "$PY" -m pytest -m cuda -p no:cacheprovider -q -rs -s --junitxml "$RESULTS/cuda_tests.xml" \
    tests/backends/test_cuda.py
# the benchmark needs about 200 s: wait for the model only as long as that leaves
echo "=== waiting for the 0.6B model ($SECONDS s elapsed)"
while kill -0 "$BUILD" 2> /dev/null && [ "$SECONDS" -lt $((BUDGET - 200)) ]; do sleep 2; done
if kill -0 "$BUILD" 2> /dev/null; then
    echo "the 0.6B model is not written yet: stopped; the benchmark skips the end to end"
    pkill -P "$BUILD" 2> /dev/null    # its timeout process (which stops the writer), then the subshell
    kill "$BUILD" 2> /dev/null
    wait "$BUILD" 2> /dev/null
    echo 124 > "$RESULTS/build_0_6b.rc"
fi
BUILD_RC=$(cat "$RESULTS/build_0_6b.rc" 2> /dev/null || echo "?")
echo "build_0_6b $BUILD_RC $SECONDS" >> "$RESULTS/steps.txt"
tail -3 "$RESULTS/build_0_6b.log"
if [ "$BUILD_RC" != 0 ]; then
    rm -rf -- "$MODEL_DIR"    # a half-written model must not be benchmarked
fi
step bench 240 "$PY" benchmarks/bench_gpu.py --out "$RESULTS"

"$PY" - "$RESULTS" <<'EOF' | tee "$RESULTS/summary.txt"
import json, sys
from pathlib import Path
results = Path(sys.argv[1])
print("steps (name, exit status, seconds):")
print("".join(f"  {line}\n" for line in (results / "steps.txt").read_text().splitlines()), end="")
path = results / "bench_gpu.json"
if not path.is_file():
    sys.exit("no bench_gpu.json: the benchmark did not run")
data = json.loads(path.read_text())
print(f"device: {data.get('device', {}).get('cupy', 'unavailable')}")
for part in ("decode", "encode", "end_to_end", "official"):
    for key, value in data.get(part, {}).items():
        if isinstance(value, dict):
            shown = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in value.items()}
            print(f"  {part} {key}: {shown}")
        else:
            print(f"  {part} {key}: {value}")
decode32 = data.get("decode", {}).get("float32", {}).get("x_realtime")
if decode32:
    print(f"decode of 10 s in float32: {decode32:.1f}x real time (target: at least 50x) -> "
          f"{'MET' if decode32 >= 50 else 'NOT met'}")
for part, error in data.get("errors", {}).items():
    print(f"ERROR in {part}: {error}")
EOF
echo "GPU check done in $SECONDS s"
