"""apex's `fused_weight_gradient_mlp_cuda` CUDA extension alone, as a wheel of its own, for sm_90 (H100/H200).

    python scripts/gpu/build_apex_wgrad.py APEX_SRC OUT_DIR [--arch 9.0]

Run it with the Python and torch the wheel is for (fetch_wheels.sh's Python 3.12 build venv: torch 2.11.0+cu130,
nvcc 13.0 from pip's cuda-toolkit, CUDA_HOME pointing at it). Writes
OUT_DIR/apex_fused_weight_gradient_mlp_cuda-<apex version>+cu<CUDA>.torch<torch>-cp312-cp312-linux_x86_64.whl.

Why: megatron-core fuses the weight-gradient GEMM with the accumulation into the fp32 main gradient of its own linear
layers through this extension, and imports it at the top of megatron/core/tensor_parallel/layers.py. apex builds it
only under `--cuda_ext`, together with ~15 other extensions (amp_C, syncbn, fused_layer_norm_cuda, mlp_cuda, ...)
that Megatron-SWIFT's LoRA path does not need and that take far longer to compile. This script compiles apex's OWN
sources of this one extension with apex's OWN compiler flags and include directory, read from APEX_SRC/setup.py (the
`CUDAExtension(name="fused_weight_gradient_mlp_cuda", ...)` call, parsed, not imported: that setup.py runs nvcc and
probes torch at import); nothing of apex is copied or changed. It differs from apex's `--cuda_ext` build in two
things: TORCH_CUDA_ARCH_LIST is `--arch` (9.0 by default: sm_90 code only, where apex cross-compiles for 7.5-12.0
without a GPU), and the module is packaged on its own (the same top-level module name `fused_weight_gradient_mlp_cuda`,
so `import fused_weight_gradient_mlp_cuda` works as with apex's own install); and its link drops the debug
information that Python's own CFLAGS (-g) put in (9.7 of 10 MB; no compiler flag changes).
Pair it with apex's Python package built without extension flags (fetch_wheels.sh megatron builds both).

As apex's setup.py does, it refuses when nvcc's CUDA version differs from the one torch was built with. pip's
cuda-toolkit ships libcudart.so.13 without the unversioned libcudart.so the linker's -lcudart looks for: the build
links through a symlink to it in its temporary directory (the module still needs libcudart.so.13, loaded by torch).
"""
from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Tuple

EXTENSION = 'fused_weight_gradient_mlp_cuda'


def _kw(call: ast.Call, name: str):
    return next((k.value for k in call.keywords if k.arg == name), None)


def apex_extension(apex_src: str) -> Tuple[List[str], Dict[str, List[str]], List[str]]:
    """(sources, extra_compile_args, include_dirs) of apex's own CUDAExtension for EXTENSION, paths absolute."""
    setup_py = os.path.join(apex_src, 'setup.py')
    try:
        with open(setup_py, encoding='utf-8') as f:
            tree = ast.parse(f.read(), setup_py)
    except OSError as e:
        raise SystemExit(f'build_apex_wgrad: no apex source at {apex_src} ({e})') from e
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and getattr(node.func, 'id', None) == 'CUDAExtension'):
            continue
        name = _kw(node, 'name')
        if not (isinstance(name, ast.Constant) and name.value == EXTENSION):
            continue
        where = f'{setup_py}:{node.lineno}'
        try:
            sources = ast.literal_eval(_kw(node, 'sources'))
            flags = ast.literal_eval(_kw(node, 'extra_compile_args'))
        except ValueError as e:
            raise SystemExit(f'build_apex_wgrad: {where}: sources/extra_compile_args of {EXTENSION} are no longer '
                             f'literals ({e}); read the call and update this script') from e
        includes = []
        inc = _kw(node, 'include_dirs')
        for item in (inc.elts if isinstance(inc, ast.List) else []):
            # apex writes them as os.path.join(this_dir, "csrc"), this_dir being the source root
            text = ast.unparse(item)
            m = re.fullmatch(r"os\.path\.join\(this_dir, '([^']+)'\)", text)
            if not m:
                raise SystemExit(f'build_apex_wgrad: {where}: include_dirs entry {text} is not '
                                 f'os.path.join(this_dir, <dir>); read the call and update this script')
            includes.append(os.path.join(apex_src, m.group(1)))
        missing = [s for s in sources if not os.path.isfile(os.path.join(apex_src, s))]
        if missing or set(flags) != {'cxx', 'nvcc'}:
            raise SystemExit(f'build_apex_wgrad: {where}: missing sources {missing} or flags not for cxx+nvcc '
                             f'({sorted(flags)})')
        return [os.path.join(apex_src, s) for s in sources], flags, includes
    raise SystemExit(f'build_apex_wgrad: {setup_py} has no CUDAExtension(name="{EXTENSION}", ...)')


def apex_version(apex_src: str) -> str:
    with open(os.path.join(apex_src, 'setup.py'), encoding='utf-8') as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, 'id', None) == 'setup':
            version = _kw(node, 'version')
            if isinstance(version, ast.Constant):
                return str(version.value)
    raise SystemExit('build_apex_wgrad: apex setup.py names no version')


def nvcc_version(cuda_home: str) -> str:
    out = subprocess.run([os.path.join(cuda_home, 'bin', 'nvcc'), '-V'], check=True, capture_output=True,
                         text=True).stdout
    m = re.search(r'release (\d+\.\d+)', out)
    if not m:
        raise SystemExit(f'build_apex_wgrad: cannot read the CUDA release from nvcc -V:\n{out}')
    return m.group(1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('apex_src', help='apex source tree (its setup.py and csrc/)')
    ap.add_argument('out_dir', help='where the wheel is written')
    ap.add_argument('--arch', default='9.0', help='TORCH_CUDA_ARCH_LIST (default 9.0: H100/H200 only)')
    args = ap.parse_args(argv)
    apex_src, out_dir = os.path.abspath(args.apex_src), os.path.abspath(args.out_dir)
    sources, flags, includes = apex_extension(apex_src)

    # torch reads CUDA_HOME and TORCH_CUDA_ARCH_LIST when cpp_extension is imported and when it compiles
    os.environ['TORCH_CUDA_ARCH_LIST'] = args.arch
    import torch
    from setuptools import setup
    from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension

    if CUDA_HOME is None:
        raise SystemExit('build_apex_wgrad: torch finds no CUDA (set CUDA_HOME to a toolkit with bin/nvcc)')
    cuda = nvcc_version(CUDA_HOME)
    if cuda != torch.version.cuda:  # apex's check_cuda_torch_binary_vs_bare_metal
        raise SystemExit(f'build_apex_wgrad: nvcc in {CUDA_HOME} is CUDA {cuda}, torch {torch.__version__} was built '
                         f'with CUDA {torch.version.cuda}: apex refuses this mix, so does this build')
    version = f'{apex_version(apex_src)}+cu{cuda.replace(".", "")}.torch{torch.__version__.split("+")[0]}'
    print(f'build_apex_wgrad: {EXTENSION} {version} for TORCH_CUDA_ARCH_LIST={args.arch}, nvcc {cuda} at {CUDA_HOME}')
    print(f'  sources (apex setup.py): {[os.path.relpath(s, apex_src) for s in sources]}')
    print(f'  extra_compile_args (apex setup.py): {flags}')
    print(f'  include_dirs (apex setup.py): {[os.path.relpath(i, apex_src) for i in includes]}')

    os.makedirs(out_dir, exist_ok=True)
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix='apex_wgrad_') as tmp:
        lib_dirs = []
        cuda_lib = os.path.join(CUDA_HOME, 'lib64' if os.path.isdir(os.path.join(CUDA_HOME, 'lib64')) else 'lib')
        if not os.path.exists(os.path.join(cuda_lib, 'libcudart.so')):
            versioned = sorted(f for f in os.listdir(cuda_lib) if re.fullmatch(r'libcudart\.so\.\d+', f))
            if not versioned:
                raise SystemExit(f'build_apex_wgrad: no libcudart.so* in {cuda_lib}')
            os.makedirs(os.path.join(tmp, 'link'))
            os.symlink(os.path.join(cuda_lib, versioned[-1]), os.path.join(tmp, 'link', 'libcudart.so'))
            lib_dirs.append(os.path.join(tmp, 'link'))
        # the link drops debug information (-g comes from Python's own CFLAGS, not from apex): 9.7 of the module's
        # 10 MB, which would ride along in every device call; the code is the same
        ext = CUDAExtension(name=EXTENSION, sources=sources, include_dirs=includes, extra_compile_args=flags,
                            library_dirs=lib_dirs, extra_link_args=['-Wl,--strip-debug'])
        cwd = os.getcwd()
        os.chdir(tmp)  # setuptools writes egg-info and build/ next to the working directory
        try:
            setup(name='apex_fused_weight_gradient_mlp_cuda', version=version,
                  description=f"apex's {EXTENSION} extension (NVIDIA apex, BSD-3-Clause), built alone",
                  ext_modules=[ext], cmdclass={'build_ext': BuildExtension}, py_modules=[],
                  # bdist_wheel builds (into tmp/build: the working directory) and packs in one pass
                  script_args=['bdist_wheel', '--bdist-dir', os.path.join(tmp, 'bdist'), '--dist-dir', out_dir])
        finally:
            os.chdir(cwd)
    wheels = [f for f in os.listdir(out_dir) if f.startswith('apex_fused_weight_gradient_mlp_cuda-' + version)]
    for w in wheels:
        print(f'build_apex_wgrad: {os.path.join(out_dir, w)} '
              f'({os.path.getsize(os.path.join(out_dir, w)) / 1e6:.2f} MB) in {time.time() - t0:.0f} s')
    return 0 if wheels else 1


if __name__ == '__main__':
    sys.exit(main())
