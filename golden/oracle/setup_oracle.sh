#!/usr/bin/env bash
# Build the oracle environment (the official qwen-tts on CPU PyTorch) in a separate venv.
# Usage: bash golden/oracle/setup_oracle.sh [VENV_DIR]   (default: .oracle-venv)
set -euo pipefail
venv=${1:-.oracle-venv}
python3 -m venv "$venv"
# torch first: the local CPU build; anything that pulls torch later must find it already installed
"$venv/bin/pip" install torch==2.13.0
"$venv/bin/pip" install -e ".[reference]"
# qwen-tts declares gradio/onnxruntime/sox/torchaudio, used only by its demo and 25 Hz tokenizer:
# install it without dependencies; golden/oracle/stubs stands in for the 25 Hz-only imports.
"$venv/bin/pip" install --no-deps qwen-tts==0.1.1
echo "oracle ready: $venv/bin/python golden/oracle/record_<stage>.py"
