"""scripts/gpu/build_apex_wgrad.py reads the sources, flags and include directory of apex's
fused_weight_gradient_mlp_cuda from apex's own setup.py (parsed, never run) and refuses when it cannot: a build
that silently compiled other flags, or another extension, would not be apex's. A setup.py written as apex writes
it stands in for the real one (no apex source in the repository)."""
import os
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'scripts', 'gpu'))
import build_apex_wgrad  # noqa: E402

SOURCES = ['csrc/megatron/fused_weight_gradient_dense.cpp', 'csrc/megatron/fused_weight_gradient_dense_cuda.cu',
           'csrc/megatron/fused_weight_gradient_dense_16bit_prec_cuda.cu']
NVCC = ['-O3', '-U__CUDA_NO_HALF_OPERATORS__', '-U__CUDA_NO_HALF_CONVERSIONS__', '--expt-relaxed-constexpr',
        '--expt-extended-lambda', '--use_fast_math']


def apex_tree(tmp_path, sources=SOURCES, call=None):
    """An apex-shaped source tree: setup.py with --cuda_ext's extensions (another one first) and the sources."""
    for s in SOURCES:
        (tmp_path / s).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / s).write_text('// source\n')
    call = call or f'''CUDAExtension(
            name="fused_weight_gradient_mlp_cuda",
            include_dirs=[os.path.join(this_dir, "csrc")],
            sources={sources!r},
            extra_compile_args={{"cxx": ["-O3"], "nvcc": {NVCC!r}}},
        )'''
    (tmp_path / 'setup.py').write_text(textwrap.dedent(f'''\
        import os
        this_dir = os.path.dirname(os.path.abspath(__file__))
        ext_modules = []
        if has_flag("--cuda_ext", "APEX_CUDA_EXT"):
            ext_modules.append(CUDAExtension(name="mlp_cuda", sources=["csrc/mlp.cpp"],
                                             extra_compile_args={{"cxx": ["-O3"], "nvcc": ["-O0"]}}))
            ext_modules.append({call})
        setup(name="apex", version="0.1", ext_modules=ext_modules)
        '''))
    return str(tmp_path)


def test_apexs_own_sources_flags_and_include_dir(tmp_path):
    src = apex_tree(tmp_path)
    sources, flags, includes = build_apex_wgrad.apex_extension(src)
    assert sources == [os.path.join(src, s) for s in SOURCES]
    assert flags == {'cxx': ['-O3'], 'nvcc': NVCC}  # this extension's, not mlp_cuda's
    assert includes == [os.path.join(src, 'csrc')]
    assert build_apex_wgrad.apex_version(src) == '0.1'


def test_a_setup_py_without_the_extension_is_refused(tmp_path):
    src = apex_tree(tmp_path, call='CUDAExtension(name="other_cuda", sources=[])')
    with pytest.raises(SystemExit, match='no CUDAExtension\\(name="fused_weight_gradient_mlp_cuda"'):
        build_apex_wgrad.apex_extension(src)


def test_a_missing_source_or_a_computed_argument_is_refused(tmp_path):
    src = apex_tree(tmp_path, sources=[*SOURCES, 'csrc/megatron/new_kernel.cu'])
    with pytest.raises(SystemExit, match='new_kernel.cu'):
        build_apex_wgrad.apex_extension(src)
    computed = apex_tree(tmp_path, call='CUDAExtension(name="fused_weight_gradient_mlp_cuda", sources=SRC, '
                                        'extra_compile_args={"cxx": [], "nvcc": []})')
    with pytest.raises(SystemExit, match='no longer literals'):
        build_apex_wgrad.apex_extension(computed)


def test_no_apex_tree_says_where_it_looked(tmp_path):
    with pytest.raises(SystemExit, match=f'no apex source at {tmp_path / "missing"}'):
        build_apex_wgrad.apex_extension(str(tmp_path / 'missing'))
