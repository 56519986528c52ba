# Prepare the lent GPU machine (no registry there) from the wheels carried in .whl/<set>/.
#
#   source scripts/gpu/setup_env.sh [swift|unsloth]   # install (once per machine), then export the env here
#   bash   scripts/gpu/setup_env.sh [swift|unsloth]   # install and print versions only (env not kept)
#
# Overrides (for tests elsewhere): SWIFT_VORA_PYTHON (interpreter, default python3), SWIFT_VORA_WHEELS (wheel
# folder, default .whl/<set>), SWIFT_VORA_SITE (target folder).
#
# Run from anywhere; paths are taken from this file's location (the repository root is two folders up).
# What it does:
#   1. pip-installs .whl/<set>/*.whl into a --target folder ($TMPDIR/site for `swift`, $TMPDIR/site-unsloth for
#      `unsloth`: their trl/datasets pins differ and must never share a folder). Done once; a marker with
#      the wheel list skips it on the next `source`.
#   2. Makes swift-vora importable and the `--custom_register_path swift_vora` hook active:
#      `pip install --no-index --find-links .whl/swift/build --no-deps -e .` into the machine's Python (hatchling
#      and its deps come from .whl/swift/build), which also puts `_swift_vora_hook.py` and
#      `swift_vora_plugin_path.pth` into its site-packages and the `swift-vora` script on its PATH. Without
#      the build wheels (the unsloth set) or if that fails, it copies the two hook files into site-packages
#      itself and relies on PYTHONPATH for the package (a .pth file is only read from a site directory, never
#      from a --target folder on PYTHONPATH).
#   3. Exports PYTHONPATH=<site>:<repo>, PATH=<site>/bin:$PATH and the offline / NCCL settings:
#      HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 MODELSCOPE_OFFLINE=1 USE_HF=1
#      NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
#      FORCE_QWENVL_VIDEO_READER=decord PYTHONUNBUFFERED=1 (+ UNSLOTH_* for the unsloth set).
#   4. Prints versions (Python, torch/CUDA/GPU, transformers, peft, accelerate, ms-swift, deepspeed, ...) and
#      checks that `import_external_file('swift_vora')` (what `--custom_register_path swift_vora` does)
#      registers the `video_ora` template. Returns/exits non-zero if any step fails.

_sv_main() {
  local set="${1:-swift}"
  local root; root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  local py="${SWIFT_VORA_PYTHON:-python3}"
  local wheels="${SWIFT_VORA_WHEELS:-$root/.whl/$set}"
  local site
  case "$set" in
    swift) site="${SWIFT_VORA_SITE:-${TMPDIR:-/tmp}/site}";;
    unsloth) site="${SWIFT_VORA_SITE:-${TMPDIR:-/tmp}/site-unsloth}";;
    *) echo "setup_env: unknown wheel set '$set' (swift|unsloth)" >&2; return 2;;
  esac
  if ! ls "$wheels"/*.whl >/dev/null 2>&1; then
    echo "setup_env: no wheels in $wheels -- run scripts/gpu/fetch_wheels.sh here and carry .whl/$set" >&2
    return 1
  fi

  # 1. wheels -> --target folder (once)
  local stamp; stamp="$(cd "$wheels" && ls *.whl | sort | md5sum | cut -c1-16)"
  if [ "$(cat "$site/.swift_vora_wheels" 2>/dev/null)" != "$stamp" ]; then
    local t0=$SECONDS
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
      "$wheels"/*.whl || { echo "setup_env: pip install into $site failed" >&2; return 1; }
    echo "$stamp" > "$site/.swift_vora_wheels"
    echo "setup_env: installed $(ls "$wheels"/*.whl | wc -l) wheels into $site in $((SECONDS - t0)) s"
  else
    echo "setup_env: $site already holds .whl/$set"
  fi

  # 3. environment (exported before step 2 so that its checks see it)
  export PYTHONPATH="$site:$root${PYTHONPATH:+:$PYTHONPATH}"
  export PATH="$site/bin:$PATH"
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 MODELSCOPE_OFFLINE=1 USE_HF=1
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  export FORCE_QWENVL_VIDEO_READER=decord PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
  export HF_DATASETS_CACHE="${HF_DATASETS_CACHE:-${TMPDIR:-/tmp}/swift_vora_hf_datasets}"
  export MODELSCOPE_CACHE="${MODELSCOPE_CACHE:-${TMPDIR:-/tmp}/swift_vora_modelscope}"
  if [ "$set" = unsloth ]; then
    export UNSLOTH_DISABLE_STATISTICS=1 UNSLOTH_COMPILE_LOCATION="${UNSLOTH_COMPILE_LOCATION:-${TMPDIR:-/tmp}/unsloth_compiled_cache}"
  fi

  # 2. swift-vora itself + the plugin-path hook
  local purelib; purelib="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  local how=""
  local build="$wheels/build"
  [ -d "$build" ] || build="$root/.whl/swift/build"
  if ls "$build"/hatchling-*.whl >/dev/null 2>&1 && \
     (cd "$root" && "$py" -m pip install -q --no-index --find-links "$build" --no-deps -e . \
        >"${TMPDIR:-/tmp}/swift_vora_editable.log" 2>&1); then
    how="editable install (pip install -e . with hatchling from .whl/swift/build)"
  else
    [ -s "${TMPDIR:-/tmp}/swift_vora_editable.log" ] && tail -3 "${TMPDIR:-/tmp}/swift_vora_editable.log" >&2
    if cp "$root/_swift_vora_hook.py" "$root/swift_vora_plugin_path.pth" "$purelib/" 2>/dev/null; then
      how="PYTHONPATH + hook copied into $purelib"
    else
      how="PYTHONPATH only (could not write $purelib: use --custom_register_path swift_vora/__init__.py)"
    fi
  fi
  echo "setup_env: swift-vora via $how"

  # 4. versions and the plugin check
  "$py" - "$set" <<'PYEOF' || return 1
import importlib, importlib.metadata as md, os, sys
which = sys.argv[1]
names = ['torch', 'torchvision', 'transformers', 'peft', 'accelerate', 'ms-swift', 'modelscope', 'datasets', 'trl',
         'deepspeed', 'decord', 'qwen-vl-utils', 'pydantic', 'py-spy', 'swift-vora']
if which == 'unsloth':
    names = ['torch', 'transformers', 'peft', 'accelerate', 'unsloth', 'unsloth_zoo', 'trl', 'datasets',
             'bitsandbytes', 'pydantic', 'swift-vora']
vers = {}
for n in names:
    try:
        vers[n] = md.version(n)
    except md.PackageNotFoundError:
        vers[n] = None
print('python', sys.version.split()[0], sys.executable)
print(' '.join(f'{k}={v}' for k, v in vers.items()))
import torch
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f'cuda {torch.version.cuda}: {torch.cuda.device_count()} x {p.name} ({p.total_memory / 2**30:.0f} GiB)')
else:
    print('cuda: not available')
print('hook (.pth) active:', '_swift_vora_hook' in sys.modules)
if which == 'swift':
    import importlib.util
    print('swift_vora from', os.path.dirname(importlib.util.find_spec('swift_vora').origin))
    from swift.utils.utils import import_external_file  # swift first, as in `swift sft`
    import_external_file('swift_vora')  # what `--custom_register_path swift_vora` does
    from swift.template import TEMPLATE_MAPPING
    assert 'video_ora' in TEMPLATE_MAPPING, 'video_ora template not registered'
    print('plugin check: --custom_register_path swift_vora registers video_ora: ok')
    missing = [v for v in ('ms-swift', 'decord', 'swift-vora') if not vers.get(v)]
    if missing:
        sys.exit(f'missing: {missing}')
    if not vers.get('deepspeed'):  # the Megatron pack leaves it out (only ZeRO-3 imports it): say so, go on
        print('setup_env: deepspeed not installed (this wheel pack leaves it out): the ZeRO-3 phases cannot run')
PYEOF
  echo "setup_env: swift=$(command -v swift || echo none) py-spy=$(command -v py-spy || echo none)" \
       "swift-vora=$(command -v swift-vora || echo none)"
}

_sv_main "$@"
_sv_rc=$?
unset -f _sv_main
if [ "${BASH_SOURCE[0]}" = "$0" ]; then exit $_sv_rc; else return $_sv_rc; fi
