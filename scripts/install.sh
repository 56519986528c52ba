#!/usr/bin/env bash
# Creates ./.venv and installs swift-vora into it (editable), with optional extras.
#   bash scripts/install.sh            # the package: ms-swift, transformers, peft, decord, ...
#   bash scripts/install.sh test       # + pytest, hypothesis and ruff, and the pinned unsloth / unsloth_zoo
#                                      #   wheels some tests read (never install) into .fetched/wheels
#   bash scripts/install.sh deepspeed  # + DeepSpeed (multi-GPU dense training)
# torch/torchvision are pinned first: an unpinned `torch` pulled in by a dependency can resolve to a
# multi-GB build that does not match torchvision (qwen_vl_utils needs a torchvision that imports).
# pip's own output (what it downloads, its progress bars on a terminal) is shown for the large installs:
# several GB on a fresh machine, minutes that should not look like a hang.
set -euo pipefail
cd "$(dirname "$0")/.."
python_bin="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$python_bin" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
echo "== [1/2] torch 2.14.1 + torchvision 0.29.1 (the largest download)"
.venv/bin/python -m pip install "torch==2.14.1" "torchvision==0.29.1"
extras="${1:-}"
if [ -n "$extras" ]; then
  echo "== [2/2] swift-vora (editable) with [${extras}]: ms-swift, transformers, peft, video decoders, ..."
  .venv/bin/python -m pip install -e ".[${extras}]"
else
  echo "== [2/2] swift-vora (editable): ms-swift, transformers, peft, video decoders, ..."
  .venv/bin/python -m pip install -e .
fi
case ",${extras}," in
  *,test,*)
    echo "== the pinned unsloth / unsloth_zoo wheels the MoE tests read (tests/moe_wheels.py -> .fetched/wheels)"
    .venv/bin/python tests/moe_wheels.py ;;
esac
.venv/bin/swift-vora --version
