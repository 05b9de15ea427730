#!/usr/bin/env bash
# The one prepared GPU check of the cupy backend: run it on a machine with an NVIDIA GPU, from the repository
# root or anywhere:
#
#     bash benchmarks/gpu_check.sh                                   # every step
#     GPU_CHECK_STEPS=bench_gpu,bench_cpu bash benchmarks/gpu_check.sh   # only these (a rerun)
#     GPU_CHECK_DRY_RUN=1 bash benchmarks/gpu_check.sh               # the CPU dry run (no GPU needed)
#
# The steps, in this order, each under its own time limit (the whole run stays under GPU_CHECK_BUDGET_S,
# default 460 s, so that one hanging step cannot eat the others' time; GPU_CHECK_LIMIT_<step>=S overrides
# one step's limit):
#   machine      the machine (nvidia-smi, Python, NumPy, CuPy, soxr, PyTorch versions, the cupy backend);
#   install      what is missing (soxr, tokenizers, pytest, hypothesis; for the official side by side
#                transformers==4.57.3, accelerate, einops, librosa, soundfile and qwen-tts 0.1.1 without its
#                dependencies) from the wheels folder benchmarks/gpu_wheels/ with pip --no-index (the GPU
#                machine has no network); into the Python environment, or where that is not writable, with
#                pip --target into a folder this script puts on PYTHONPATH.  Without soxr the tests that
#                compare with the official resampling skip, saying so;
#   build        the full-size synthetic speech tokenizer (benchmarks/common.py), then the 0.6B CustomVoice
#                model written in the background while the next steps run (build_0_6b).  Both are written
#                under a temporary name and renamed when complete: a build stopped by its time limit leaves
#                nothing the next run would take for a checkpoint;
#   warmup       benchmarks/gpu_warmup.py: the tiny models once on the device in float32 and float64, so that
#                CuPy's kernel cache (CUPY_CACHE_DIR) is filled before the parity processes start side by side;
#   cuda_tests   python -m pytest -m cuda tests/backends/test_cuda.py (every twin on the device, every parity
#                module on the cupy backend in float32 and float64, streaming = one pass, greedy codes equal
#                to the CPU's);
#   bench_gpu    benchmarks/bench_gpu.py, the GPU parts: decode / encode / end-to-end timings in float32 and
#                float64, and the official qwen-tts on the same GPU when it and a CUDA PyTorch are importable;
#   bench_cpu    benchmarks/bench_gpu.py, the CPU references (numba) of the encode and the end to end, and
#                whether the GPU's codes equal them: after the GPU numbers, so that a slow or broken CPU side
#                costs none of them;
# and always, last, the summary.
#
# What comes back: $OUT when it is set (the device tool's output folder, of which at most 8 files return),
# else gpu-results/ in the repository.  Exactly four files are written there:
#   summary.txt     EVERYTHING that must come back, in one file: each step's exit status and seconds, the
#                   machine, the tail of each step's output, every failed or skipped test with its message,
#                   every measurement; read this first (and alone, if only one file returns);
#   gpu_check.log   everything printed;   bench_gpu.json   the measurements;   cuda_tests.xml   the JUnit report.
# The rest (each step's log, the checkpoints' build log, the codes the CPU side compares) stays in
# GPU_CHECK_WORK (default gpu-results/work/ in the repository; git-ignored).
#
# Filling the wheels folder (benchmarks/gpu_wheels/ is git-ignored). For the project's device machine (an
# H200 image with Python 3.12, CuPy, NumPy, SciPy, Numba, PyTorch, tokenizers 0.23, transformers 5 and
# huggingface_hub 1.x, but no soxr and no official package), these 18 MB were what the first GPU run needed,
# downloaded on any machine with pip and network:
#
#     P="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
#        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any"
#     pip download --no-deps $P -d benchmarks/gpu_wheels soxr transformers==4.57.3 "huggingface_hub<1.0" \
#         tokenizers==0.22.1 accelerate==1.12.0 librosa soundfile cffi pycparser audioread decorator pooch \
#         platformdirs
#     pip download --no-deps -d benchmarks/gpu_wheels qwen-tts==0.1.1
#
# (transformers 4.57.3 wants huggingface_hub below 1.0 and tokenizers at most 0.23.0; the rest is librosa's
# and soundfile's). On another machine, download what its Python lacks in the same way.
#
# Without the folder, or when pip cannot install, the check runs with what the machine has: the tests skip
# what they cannot run, and the official side by side is skipped, each saying why.
#
# The dry run (GPU_CHECK_DRY_RUN=1; tests/backends/test_gpu_check.py runs it): every step's bookkeeping on the
# CPU: the cupy steps run on the strict stand-in device with the committed tiny checkpoints (warm-up, bench),
# or skip as they would without a GPU (cuda_tests), the builds are stopped after 1 s by their time limits
# (what is left of them stays under *.partial in GPU_CHECK_WORK/bench-checkpoints/, never under a checkpoint's
# name), the install step puts what it installs into GPU_CHECK_WORK/site-packages only (never into the
# environment it runs in), and the summary is written as on the GPU.
#
# Environment: PYTHON (default python3), OUT (results folder), REFIMPL_BENCH_DIR (checkpoints, default
# bench-checkpoints/), GPU_WHEELS (default benchmarks/gpu_wheels), GPU_CHECK_BUDGET_S (default 460),
# GPU_CHECK_STEPS (comma-separated steps; default all), GPU_CHECK_WORK, GPU_CHECK_DRY_RUN,
# GPU_CHECK_LIMIT_<step>, GPU_CHECK_PACKAGES (the modules installed from the wheels when they do not import;
# default "scipy soxr tokenizers pytest hypothesis").

set -u
cd "$(dirname "$0")/.." || exit 1
REPO=$(pwd)
PY=${PYTHON:-python3}
RESULTS=${OUT:-$REPO/gpu-results}
WORK=${GPU_CHECK_WORK:-$REPO/gpu-results/work}
WHEELS=${GPU_WHEELS:-$REPO/benchmarks/gpu_wheels}
PACKAGES=${GPU_CHECK_PACKAGES:-scipy soxr tokenizers pytest hypothesis}   # installed when not importable
BUDGET=${GPU_CHECK_BUDGET_S:-460}
ALL_STEPS="machine,install,build,warmup,cuda_tests,bench_gpu,bench_cpu"
STEPS=${GPU_CHECK_STEPS:-$ALL_STEPS}
DRY_RUN=${GPU_CHECK_DRY_RUN:-0}
for asked in ${STEPS//,/ }; do
    case ",$ALL_STEPS," in
        *",$asked,"*) ;;
        *) echo "GPU_CHECK_STEPS: unknown step '$asked'; the steps are $ALL_STEPS" >&2; exit 2 ;;
    esac
done
BENCH_BACKEND=cupy
BENCH_SIZES=()
if [ "$DRY_RUN" = 1 ]; then   # the device steps on the stand-in; the builds stopped after a few seconds
    BENCH_BACKEND=strict
    BENCH_SIZES=(--tiny --frames 10 --seconds 1 --e2e-frames 3 --repeats 1)
    export REFIMPL_BENCH_DIR=$WORK/bench-checkpoints
    export GPU_CHECK_LIMIT_build=${GPU_CHECK_LIMIT_build:-1} GPU_CHECK_LIMIT_build_0_6b=${GPU_CHECK_LIMIT_build_0_6b:-1}
fi
export REFIMPL_BENCH_DIR=${REFIMPL_BENCH_DIR:-$REPO/bench-checkpoints}
SITE="$WORK/site-packages"   # pip --target installs here when the environment is not writable
export PYTHONPATH="$REPO:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$HOME/.cupy/kernel_cache}
export PYTHONUNBUFFERED=1
mkdir -p "$RESULTS" "$WORK/logs" "$SITE" "$REFIMPL_BENCH_DIR"
rm -f "$RESULTS/summary.txt" "$RESULTS/bench_gpu.json" "$RESULTS/cuda_tests.xml" "$RESULTS/gpu_check.log" \
    "$WORK/steps.txt" "$WORK/bench_codes.npz" "$WORK"/logs/*.log
: > "$WORK/steps.txt"
exec > >(tee -a "$RESULTS/gpu_check.log") 2>&1

asked() { case ",$STEPS," in *",$1,"*) return 0 ;; *) return 1 ;; esac }

# step NAME LIMIT_S COMMAND...: run COMMAND (a program: a function of this script goes through bash -c) under
# min(GPU_CHECK_LIMIT_<NAME> or LIMIT_S, what is left of the budget minus 15 s); its output also goes to
# $WORK/logs/NAME.log; one line "NAME STATUS SECONDS LIMIT" in $WORK/steps.txt (STATUS: the exit status,
# "not-asked", or "no-time" when the budget is spent)
step() {
    local name=$1 limit=$2 left start rc override="GPU_CHECK_LIMIT_$1"
    shift 2
    limit=${!override:-$limit}
    if ! asked "$name"; then
        echo "$name not-asked 0 $limit" >> "$WORK/steps.txt"
        return 0
    fi
    left=$((BUDGET - SECONDS - 15))
    if [ "$left" -lt "$limit" ]; then limit=$left; fi
    if [ "$left" -le 5 ]; then
        echo "=== $name: SKIPPED, the budget of $BUDGET s is spent"
        echo "$name no-time 0 0" >> "$WORK/steps.txt"
        return 0
    fi
    echo "=== $name (limit $limit s, $SECONDS s elapsed)"
    start=$SECONDS
    timeout -k 10 "$limit" "$@" 2>&1 | tee "$WORK/logs/$name.log"   # a pipe: tee has written all when it ends
    rc=${PIPESTATUS[0]}
    [ "$rc" -eq 124 ] && echo "=== $name: TIMED OUT after $limit s"
    echo "=== $name: exit $rc in $((SECONDS - start)) s"
    echo "$name $rc $((SECONDS - start)) $limit" >> "$WORK/steps.txt"
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
from refimpl.backends import BackendUnavailable, backend
try:
    print(f"  cupy backend: {backend('cupy').load().available()}")
except BackendUnavailable as e:
    print(f"  cupy backend UNAVAILABLE: {e}")
EOF
}

# pip_install [pip options] PACKAGES...: from the wheels folder only; into the environment, or where that is
# not writable (pip refuses --user inside a virtual environment), into $SITE (on PYTHONPATH). A dry run never
# touches the environment: into $SITE only (it runs on a developer's machine, in the developer's venv)
pip_install() {
    if [ "$DRY_RUN" = 1 ]; then
        pip_from_wheels --target "$SITE" "$@"
        return
    fi
    pip_from_wheels "$@" || pip_from_wheels --target "$SITE" "$@"
}

# pip_from_wheels [pip options] PACKAGES...: one pip install from the wheels folder, without its lines about
# what is already there (the GPU image has most of what the official package needs: on the first GPU run they
# were every line of the install step's tail); pip's exit status
pip_from_wheels() {
    "$PY" -m pip install --no-index --find-links "$WHEELS" --disable-pip-version-check "$@" 2>&1 \
        | grep -v '^Requirement already satisfied'
    return "${PIPESTATUS[0]}"
}

# installed_versions: the versions this run uses after the install step (the machine step's are from before it)
installed_versions() {
    "$PY" - <<'EOF'
from importlib import metadata
found = []
for name in ("soxr", "tokenizers", "transformers", "huggingface-hub", "librosa", "qwen-tts"):
    try:  # (installed, not imported: the official package imports only with golden/oracle/stubs on its path)
        found.append(f"{name} {metadata.version(name)}")
    except metadata.PackageNotFoundError:
        found.append(f"{name}: not installed")
print("after the install: " + ", ".join(found))
EOF
}

install_from_wheels() {
    if ! ls "$WHEELS"/*.whl > /dev/null 2>&1; then
        echo "no wheels in ${WHEELS#"$REPO"/}: running with what this machine has (refimpl from the source tree)"
        "$PY" -c "import soxr" 2> /dev/null || echo "soxr is missing: the tests of the official resampling skip"
        return 0
    fi
    local package
    for package in $PACKAGES; do   # one by one: one missing wheel stops no other
        "$PY" -c "import $package" 2> /dev/null || pip_install "$package" || echo "could not install $package"
    done
    pip_install "transformers==4.57.3" accelerate einops librosa soundfile \
        || echo "could not install the official package's dependencies: no side by side"
    pip_install --no-deps "qwen-tts==0.1.1" || echo "could not install qwen-tts: no side by side"
    installed_versions
}

export PY WHEELS REPO SITE PACKAGES DRY_RUN
export -f machine pip_install pip_from_wheels installed_versions install_from_wheels   # run by "timeout ... bash -c NAME" below
echo "GPU check of the cupy backend, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), steps $STEPS, results in $RESULTS"
[ "$DRY_RUN" = 1 ] && echo "DRY RUN: the device steps run on the strict stand-in with the tiny checkpoints"
step machine 60 bash -c machine
step install 90 bash -c install_from_wheels

# the checkpoints (atomic: benchmarks/common.py's written_once)
BUILD=""
MODEL_DIR="$REFIMPL_BENCH_DIR/released-0.6b-customvoice"
step build 120 "$PY" -c \
    "import sys; sys.path.insert(0, 'benchmarks'); import common; print(common.released_speech_tokenizer())"
if asked build; then
    override=GPU_CHECK_LIMIT_build_0_6b
    BUILD_LIMIT=${!override:-300}
    ( started=$(date +%s)
      timeout -k 10 "$BUILD_LIMIT" "$PY" -c \
          "import sys; sys.path.insert(0, 'benchmarks'); import common; print(common.released_custom_voice_0_6b())" \
          > "$WORK/logs/build_0_6b.log" 2>&1
      echo "$? $(($(date +%s) - started))" > "$WORK/build_0_6b.rc" ) &
    BUILD=$!
    BUILD_START=$SECONDS
fi

step warmup 90 "$PY" benchmarks/gpu_warmup.py --backend "$BENCH_BACKEND"
export REFIMPL_CUDA_PARITY_TIMEOUT=${REFIMPL_CUDA_PARITY_TIMEOUT:-170}   # each parity module's process
step cuda_tests 220 "$PY" -m pytest -m cuda -p no:cacheprovider -q -rfEs -s -o junit_logging=system-out \
    --junitxml "$RESULTS/cuda_tests.xml" \
    tests/backends/test_cuda.py

if [ -n "$BUILD" ]; then
    # the benchmark needs about 200 s: wait for the model only as long as that leaves
    echo "=== waiting for the 0.6B model ($SECONDS s elapsed)"
    while kill -0 "$BUILD" 2> /dev/null && [ "$SECONDS" -lt $((BUDGET - 200)) ]; do sleep 1; done
    if kill -0 "$BUILD" 2> /dev/null; then
        echo "the 0.6B model is not written yet: stopped; the benchmark skips the end to end"
        pkill -P "$BUILD" 2> /dev/null    # its timeout process (which stops the writer), then the subshell
        kill "$BUILD" 2> /dev/null
        wait "$BUILD" 2> /dev/null
        echo "124 $((SECONDS - BUILD_START))" > "$WORK/build_0_6b.rc"
    fi
    wait "$BUILD" 2> /dev/null
    read -r BUILD_RC BUILD_S < "$WORK/build_0_6b.rc" || { BUILD_RC="?"; BUILD_S="?"; }
    echo "build_0_6b $BUILD_RC $BUILD_S $BUILD_LIMIT" >> "$WORK/steps.txt"
    tail -3 "$WORK/logs/build_0_6b.log"
    [ "$BUILD_RC" != 0 ] && [ ! -f "$MODEL_DIR/model.safetensors" ] && echo "no 0.6B model: the end to end skips"
else
    echo "build_0_6b not-asked 0 0" >> "$WORK/steps.txt"
fi

step bench_gpu 200 "$PY" benchmarks/bench_gpu.py --out "$RESULTS" --codes "$WORK/bench_codes.npz" \
    --backend "$BENCH_BACKEND" --parts decode,encode,end_to_end,official "${BENCH_SIZES[@]}"
step bench_cpu 120 "$PY" benchmarks/bench_gpu.py --out "$RESULTS" --codes "$WORK/bench_codes.npz" --append \
    --backend "$BENCH_BACKEND" --parts cpu_encode,cpu_end_to_end "${BENCH_SIZES[@]}"

echo "=== summary ($SECONDS s elapsed)"
"$PY" benchmarks/gpu_summary.py --results "$RESULTS" --work "$WORK" > "$RESULTS/summary.txt.partial" \
    && mv "$RESULTS/summary.txt.partial" "$RESULTS/summary.txt"
cat "$RESULTS/summary.txt"
echo "GPU check done in $SECONDS s"
