# Megatron-SWIFT on the lent GPU machine: Transformer Engine (TE) 2.11 + megatron-core + mcore-bridge + peft 0.20,
# from the wheels `scripts/gpu/fetch_wheels.sh megatron` prepared. Source it after `source scripts/gpu/setup_env.sh
# swift` (run_all.sh's megatron phase does).
#
#   source scripts/gpu/setup_megatron.sh [all]      # reassemble + check TE, install (once), PYTHONPATH, import check
#   bash   scripts/gpu/setup_megatron.sh assemble   # reassemble the TE core wheel and check its sha256 only
#   bash   scripts/gpu/setup_megatron.sh install    # assemble + install, no import check (no GPU needed)
# Inside a function, source it with the mode spelled out: a bare `source` hands it the function's arguments.
#
# The TE core wheel arrives in parts in the git-ignored folders .te0/ [.te1/ .te2/] of the repository root, one per
# call, back to back: files of earlier calls stay on the warm machine. By default fetch_wheels.sh slims it to the H200's
# sm_90 device code (scripts/gpu/slim_te.py, 27.7 MiB: one part, one call); the untouched wheel (TE_SLIM=0, 171 MiB)
# is larger than one device call carries (64 MiB) and comes in three. `all` runs TE's Linear and GroupedLinear on the
# GPU after the import check (a slim wheel on another architecture stops there, saying how to fall back). .whl/megatron/SHA256SUMS (written by fetch_wheels.sh) lists the sha256 of each part and
# of the whole wheel; any mismatch or missing part refuses (exit 1) before anything is installed.
# All TE wheels (core, meta, torch extension) share the transformer_engine/ folder: they go in with the rest of the
# set in ONE `pip install --target` (separate --target installs replace each other's transformer_engine/). Every
# wheel of .whl/megatron goes in, apex's two among them (its Python package and fused_weight_gradient_mlp_cuda, sm_90);
# `all` then imports apex and runs the extension's weight-gradient accumulation on the GPU against torch.
#
# A wheel pack (scripts/gpu/wheel_pack.py, unpacked by run_all.sh) brings the core wheel ready, in .whl/megatron-te/
# with a SHA256SUMS of its own: when that file is there it is used (checked) and no part is needed.
#
# Overrides (tests): SWIFT_VORA_PYTHON (interpreter), SWIFT_VORA_MEGATRON_WHEELS (default .whl/megatron),
# SWIFT_VORA_TE_READY (default .whl/megatron-te),
# SWIFT_VORA_TE_PARTS (folder holding .te0-.te2, default the repository root), SWIFT_VORA_TE_WORK (where the
# wheel is reassembled, default $TMPDIR/swift_vora_te, /tmp without TMPDIR), SWIFT_VORA_MEGATRON_SITE (default
# $TMPDIR/site-megatron; put in front of PYTHONPATH so that peft 0.20 wins over the image's 0.21).

_svm_sha() { sha256sum "$1" | cut -d' ' -f1; }

# Print the reassembled, checked TE core wheel's path; return 1 (refused) on a missing part or a checksum mismatch.
_svm_assemble() {
  local wheels="$1" parts_root="$2" work="$3"
  local sums="$wheels/SHA256SUMS"
  if [ ! -f "$sums" ]; then
    echo "setup_megatron: no $sums -- run scripts/gpu/fetch_wheels.sh megatron and carry .whl/megatron" >&2
    return 1
  fi
  local core_sha="" core_name="" sha name
  local parts=() part_shas=()
  while read -r sha name; do
    [ -n "$sha" ] || continue
    case "$name" in
      .te[0-9]/*.part[0-9]) parts+=("$name"); part_shas+=("$sha");;
      *.whl) core_sha="$sha"; core_name="$name";;
      *) echo "setup_megatron: $sums: unexpected line for '$name'" >&2; return 1;;
    esac
  done < "$sums"
  if [ -z "$core_name" ] || [ ${#parts[@]} -eq 0 ]; then
    echo "setup_megatron: $sums names no wheel or no parts" >&2
    return 1
  fi
  local i missing=()
  for i in "${!parts[@]}"; do
    [ -f "$parts_root/${parts[$i]}" ] || missing+=("${parts[$i]}")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup_megatron: refused: missing TE part(s) ${missing[*]} under $parts_root -- each .teN travels in its" \
         "own device call before this one, back to back (docs/backends.md)" >&2
    return 1
  fi
  for i in "${!parts[@]}"; do
    sha="$(_svm_sha "$parts_root/${parts[$i]}")"
    if [ "$sha" != "${part_shas[$i]}" ]; then
      echo "setup_megatron: refused: ${parts[$i]} has sha256 $sha, SHA256SUMS says ${part_shas[$i]}" \
           "(a stale or truncated carry: rerun fetch_wheels.sh megatron and carry the parts again)" >&2
      return 1
    fi
  done
  mkdir -p "$work"
  local out="$work/$core_name"
  if [ -f "$out" ] && [ "$(_svm_sha "$out")" = "$core_sha" ]; then
    echo "$out"
    return 0
  fi
  # Parts in SHA256SUMS order (fetch_wheels.sh writes them part0, part1, part2).
  local paths=()
  for i in "${!parts[@]}"; do paths+=("$parts_root/${parts[$i]}"); done
  cat "${paths[@]}" > "$out.tmp" || { rm -f "$out.tmp"; return 1; }
  sha="$(_svm_sha "$out.tmp")"
  if [ "$sha" != "$core_sha" ]; then
    rm -f "$out.tmp"
    echo "setup_megatron: refused: reassembled $core_name has sha256 $sha, SHA256SUMS says $core_sha" >&2
    return 1
  fi
  mv "$out.tmp" "$out"
  echo "$out"
}

# Print the TE core wheel a wheel pack unpacked (scripts/gpu/wheel_pack.py: its members stored, not deflated, so
# its sha256 is not the parts' -- its own SHA256SUMS names it); return 1 when it is missing or altered.
_svm_ready() {
  local ready="$1" wheels="$2" sha name want_sha="" want_name="" have_sha="" have_name=""
  # the core this set expects (.whl/megatron/SHA256SUMS) must be the one the pack stored: a warm machine keeps an
  # earlier pack's .whl/megatron-te/ when a later call carries other wheels
  [ -f "$wheels/SHA256SUMS" ] && read -r want_sha want_name <<< "$(grep -E '\.whl$' "$wheels/SHA256SUMS" | head -1)"
  [ -f "$ready/SOURCE_SHA256" ] && read -r have_sha have_name < "$ready/SOURCE_SHA256"
  if [ -z "$want_sha" ] || [ "$want_sha" != "$have_sha" ] || [ "$want_name" != "$have_name" ]; then
    echo "setup_megatron: refused: the wheel pack's TE core ($ready/SOURCE_SHA256: '${have_name:-missing}'" \
         "${have_sha:0:12}) is not the one $wheels/SHA256SUMS names ('${want_name:-none}' ${want_sha:0:12}): pack" \
         "again, or remove $ready to use the parts" >&2
    return 1
  fi
  read -r sha name < "$ready/SHA256SUMS"
  if [ -z "$name" ] || [ ! -f "$ready/$name" ]; then
    echo "setup_megatron: refused: $ready/SHA256SUMS names '${name:-nothing}', which is not there" >&2
    return 1
  fi
  if [ "$(_svm_sha "$ready/$name")" != "$sha" ]; then
    echo "setup_megatron: refused: $ready/$name has sha256 $(_svm_sha "$ready/$name"), $ready/SHA256SUMS says $sha" >&2
    return 1
  fi
  echo "$ready/$name"
}

_svm_main() {
  local mode="${1:-all}"
  case "$mode" in
    all|assemble|install) ;;
    *) echo "setup_megatron: unknown mode '$mode' (assemble|install)" >&2; return 2;;
  esac
  local root; root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  local py="${SWIFT_VORA_PYTHON:-python3}"
  local wheels="${SWIFT_VORA_MEGATRON_WHEELS:-$root/.whl/megatron}"
  local parts_root="${SWIFT_VORA_TE_PARTS:-$root}"
  local work="${SWIFT_VORA_TE_WORK:-${TMPDIR:-/tmp}/swift_vora_te}"
  local site="${SWIFT_VORA_MEGATRON_SITE:-${TMPDIR:-/tmp}/site-megatron}"
  local ready="${SWIFT_VORA_TE_READY:-$root/.whl/megatron-te}"

  local core
  if [ -f "$ready/SHA256SUMS" ]; then
    core="$(_svm_ready "$ready" "$wheels")" || return 1
    echo "setup_megatron: TE core wheel from the wheel pack, checked: $core"
  else
    core="$(_svm_assemble "$wheels" "$parts_root" "$work")" || return 1
    echo "setup_megatron: TE core wheel reassembled and checked: $core"
  fi
  [ "$mode" = assemble ] && return 0

  if ! ls "$wheels"/*.whl >/dev/null 2>&1; then
    echo "setup_megatron: no wheels in $wheels" >&2
    return 1
  fi
  local stamp; stamp="$( (basename "$core"; cd "$wheels" && ls *.whl) | sort | md5sum | cut -c1-16)"
  if [ "$(cat "$site/.swift_vora_wheels" 2>/dev/null)" != "$stamp" ]; then
    local t0=$SECONDS
    rm -rf "$site"
    # ONE install: the TE wheels share transformer_engine/ (see the header).
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$core" "$wheels"/*.whl \
      || { echo "setup_megatron: pip install into $site failed" >&2; return 1; }
    echo "$stamp" > "$site/.swift_vora_wheels"
    echo "setup_megatron: installed $(( $(ls "$wheels"/*.whl | wc -l) + 1 )) wheels into $site in $((SECONDS - t0)) s"
  else
    echo "setup_megatron: $site already holds this set"
  fi
  [ "$mode" = install ] && return 0

  case ":${PYTHONPATH:-}:" in *":$site:"*) ;; *) export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}";; esac
  # What Megatron-SWIFT imports first; TE's harmless "no JAX extension" warning is filtered out.
  local out rc
  out="$("$py" - 2>&1 <<'PYEOF'
import importlib.metadata as md
import peft, torch
import transformer_engine.pytorch as te  # noqa: F401  (loads the core library and the torch extension)
import megatron.core, mcore_bridge  # noqa: F401  (mcore_bridge patches TE classes at import)
names = ['transformer-engine', 'transformer-engine-cu13', 'transformer-engine-torch', 'megatron-core', 'mcore-bridge',
         'peft']
print('megatron set:', ' '.join(f'{n}={md.version(n)}' for n in names), '| torch', torch.__version__)
assert peft.__version__.startswith('0.20'), f'peft {peft.__version__} from {peft.__file__}: ms-swift wants <0.21'
if torch.cuda.is_available():  # TE's kernels load for this GPU (the slim wheel holds sm_90 code only)
    try:
        x = torch.randn(32, 64, device='cuda', dtype=torch.bfloat16, requires_grad=True)
        te.Linear(64, 64, params_dtype=torch.bfloat16).cuda()(x).float().sum().backward()
        te.GroupedLinear(2, 64, 64, params_dtype=torch.bfloat16).cuda()(x, [16, 16]).float().sum().backward()
        torch.cuda.synchronize()
    except RuntimeError as e:
        sm = ''.join(map(str, torch.cuda.get_device_capability()))
        raise SystemExit(f'TE kernels failed on {torch.cuda.get_device_name()} (sm_{sm}): {e}. A slim TE wheel '
                         'holds one architecture: rerun scripts/gpu/fetch_wheels.sh megatron with TE_SLIM=0 (three '
                         'parts) or TE_KEEP_SM=<sm>') from e
    print('TE kernels (Linear, GroupedLinear fwd+bwd, bf16) ran on', torch.cuda.get_device_name())
# apex (fetch_wheels.sh builds it with its fused_weight_gradient_mlp_cuda, sm_90 only): megatron-core's gradient
# accumulation fusion. Without it the run still trains (Megatron-SWIFT turns the fusion off); with apex but no working
# extension megatron-core would stop building the model: refuse here, before minutes of model building
import importlib.util
if importlib.util.find_spec('apex') is None:
    print('apex: not in this set (Megatron-SWIFT runs with gradient accumulation fusion off)')
else:
    import apex  # noqa: F401
    import fused_weight_gradient_mlp_cuda as wgrad
    print('apex', md.version('apex'), '+ fused_weight_gradient_mlp_cuda', md.version('apex-fused-weight-gradient-mlp-cuda'))
    if torch.cuda.is_available():  # megatron-core's call: main_grad (fp32, out x in) += grad_output^T @ input
        x = torch.randn(64, 32, device='cuda', dtype=torch.bfloat16)
        g = torch.randn(64, 48, device='cuda', dtype=torch.bfloat16)
        main_grad = torch.ones(48, 32, device='cuda', dtype=torch.float32)
        want = main_grad + g.float().t() @ x.float()
        try:
            wgrad.wgrad_gemm_accum_fp32(x, g, main_grad)
            torch.cuda.synchronize()
        except RuntimeError as e:
            raise SystemExit(f'apex\'s fused_weight_gradient_mlp_cuda failed on {torch.cuda.get_device_name()}: {e} '
                             '(fetch_wheels.sh builds it for sm_90 only)') from e
        assert torch.allclose(main_grad, want, rtol=1e-3, atol=1e-2), (main_grad - want).abs().max()
        print('apex wgrad_gemm_accum_fp32 (bf16 -> fp32 main grad) ran on', torch.cuda.get_device_name())
PYEOF
)"
  rc=$?
  printf '%s\n' "$out" | grep -v -i 'jax'
  [ "$rc" = 0 ] || { echo "setup_megatron: import check failed" >&2; return 1; }
}

_svm_main "$@"
_svm_rc=$?
unset -f _svm_main _svm_assemble _svm_ready _svm_sha
if [ "${BASH_SOURCE[0]}" = "$0" ]; then exit $_svm_rc; else return $_svm_rc; fi
