"""The classes Unsloth's compiler generates for Qwen3.5-MoE, made on the CPU from the pinned unsloth and unsloth_zoo
wheels (tests/moe_wheels.py: the GPU machine's MoE set in .whl/moe, else the same versions that
`bash scripts/install.sh test` downloads into .fetched/wheels).

unsloth_zoo's `create_standalone_class` writes, per modeling class, a module-level copy of its forward
(`{Class}_forward`, under Unsloth's compile or compile-disable decorator) and a class whose forward is one call of
it. Unsloth puts them in one generated module that imports the modeling module's names -- `__name__` among them
(unsloth_compiled_module_qwen3_5_moe.py, read on the CPU: `from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe
import (F, ..., __name__, ...)`), so its classes claim the modeling module as theirs. `compiled_module` rebuilds
that: the generator run in a subprocess (importing unsloth_zoo sets process-wide state), its source loaded under
the same kind of prelude, with Unsloth's two decorators as pass-through stand-ins."""
import importlib.util
import os
import subprocess
import sys
import zipfile

import moe_wheels

# unsloth_zoo refuses to import where unsloth is not beside it: both wheels, unpacked side by side
WHEELS = moe_wheels.wheels()  # .whl/moe (the GPU machine's set), else the pins in .fetched/wheels
MISSING = moe_wheels.MISSING
MODELING = 'transformers.models.qwen3_5_moe.modeling_qwen3_5_moe'
GENERATE = '''import sys, transformers, {modeling}
import unsloth_zoo.compiler as compiler
compiler.transformers = transformers  # the compiler evals the model's location in its own globals
disable = sys.argv[3] == '1'  # DISABLE_COMPILE_MODULES (the Gated DeltaNet); the router compiles
open(sys.argv[1], 'w').write(compiler.create_standalone_class(sys.argv[2], {modeling!r}, [], fullgraph=False,
                                                               disable=disable))
'''
PRELUDE = '''import functools
import {modeling} as _modeling
globals().update({{k: v for k, v in vars(_modeling).items() if not k.startswith("__")}})
from {modeling} import __name__  # as Unsloth's generated module does: its classes claim the modeling module


def _pass_through(fn=None, **options):  # Unsloth's torch_compile_with_fallback / torch_compiler_disable_unless_decode
    if fn is None:
        return _pass_through

    @functools.wraps(fn)
    def run(*args, **kwargs):
        return fn(*args, **kwargs)
    return run


torch_compile_with_fallback = torch_compiler_disable_unless_decode = _pass_through
torch_compile_options = {{}}
'''


def unpack(tmp_path):
    """Both wheels unpacked into tmp_path/zoo (the folder to put on PYTHONPATH)."""
    for wheel in WHEELS:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(tmp_path / 'zoo')
    return tmp_path / 'zoo'


def generated_source(tmp_path, class_name: str, disable: bool) -> str:
    zoo = tmp_path / 'zoo'
    if not zoo.is_dir():
        unpack(tmp_path)
    out = tmp_path / f'{class_name}.generated.py'
    env = {**os.environ, 'PYTHONPATH': str(zoo), 'UNSLOTH_IS_PRESENT': '1'}
    proc = subprocess.run([sys.executable, '-c', GENERATE.format(modeling=MODELING), str(out), class_name,
                           '1' if disable else '0'], env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return out.read_text()


def load_module(tmp_path, module_name: str, source: str):
    """`source` under Unsloth's kind of prelude, loaded from a file (so that its functions' source can be read);
    registered nowhere in sys.modules."""
    path = tmp_path / f'{module_name}.py'
    path.write_text(PRELUDE.format(modeling=MODELING) + source)
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compiled_module(tmp_path, module_name: str, *classes):
    """A module holding Unsloth's generated copies of `classes` ((name, disable) pairs) (load_module)."""
    return load_module(tmp_path, module_name, '\n\n'.join(generated_source(tmp_path, name, disable)
                                                           for name, disable in classes))
