#!/usr/bin/env bash
# Creates ./.venv and installs swift-vora into it (editable), with optional extras.
#   bash scripts/install.sh            # the package: ms-swift, transformers, peft, decord, ...
#   bash scripts/install.sh test       # + pytest and hypothesis
#   bash scripts/install.sh deepspeed  # + DeepSpeed (multi-GPU dense training)
# torch/torchvision are pinned first: an unpinned `torch` pulled in by a dependency can resolve to a
# multi-GB build that does not match torchvision (qwen_vl_utils needs a torchvision that imports).
set -euo pipefail
cd "$(dirname "$0")/.."
python_bin="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$python_bin" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.14.1" "torchvision==0.29.1"
extras="${1:-}"
if [ -n "$extras" ]; then
  .venv/bin/python -m pip install -q -e ".[${extras}]"
else
  .venv/bin/python -m pip install -q -e .
fi
.venv/bin/swift-vora --version
