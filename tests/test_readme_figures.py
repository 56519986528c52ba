"""The README's measured figures are the result files' (benchmarks/readme_figures.py): a README edited by hand, or a
result file that changed, fails here until `python benchmarks/readme_figures.py --write` regenerates the blocks."""
import importlib.util
import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location('readme_figures', os.path.join(REPO, 'benchmarks', 'readme_figures.py'))
readme_figures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(readme_figures)


@pytest.fixture(scope='module')
def blocks():
    return readme_figures.generated()


@pytest.fixture(scope='module')
def readme():
    with open(readme_figures.README, encoding='utf-8') as f:
        return f.read()


def test_the_readme_blocks_are_what_the_files_give(readme, blocks):
    problems = readme_figures.differences(readme, blocks)
    assert not problems, '\n'.join(problems) + '\n(python benchmarks/readme_figures.py --write regenerates them)'


def test_a_figure_edited_by_hand_or_a_block_dropped_is_found(readme, blocks):
    assert '12,285 tokens/s' in blocks['measured']  # call m's median step, from its file
    edited = readme.replace('12,285 tokens/s', '12,985 tokens/s', 1)
    assert any("block 'measured' differs" in p and '12,985' in p for p in readme_figures.differences(edited, blocks))
    start = readme.index('<!-- figures:planner_accuracy')
    dropped = readme[:start] + readme[readme.index('<!-- /figures:planner_accuracy -->') + 40:]
    assert any("no block 'planner_accuracy'" in p for p in readme_figures.differences(dropped, blocks))
    assert readme_figures.differences(readme_figures.rewrite(edited, blocks), blocks) == []


def test_every_figure_says_its_steps_and_every_mfu_its_divisor(blocks):
    text = ' '.join(blocks['measured'].split())  # as Markdown reads it, line breaks joined
    quoted = re.findall(r'MFU \d\.\d+ of 790 TFLOP/s measured \(\d\.\d+ of the 989 spec\)', text)
    assert len(re.findall(r'MFU \d', text)) == len(quoted) >= 3
    # the Triton expert GEMMs' figure measured 9 steps: quoted as indicative, never as a measurement of the protocol
    assert "7,986 at micro-batch 4, 9 measured steps, before the protocol's 10: indicative" in text
    assert '3.3x' not in text.replace('(An earlier figure, 3.3x, came from a file assembled by hand from 4 measured '
                                      'steps before the protocol: not quoted.)', '')
    assert readme_figures.steps_note(10) == '10 measured steps'
    assert readme_figures.mfu(0.236) == 'MFU 0.236 of 790 TFLOP/s measured (0.189 of the 989 spec)'
