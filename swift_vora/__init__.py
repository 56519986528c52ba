"""swift-vora: Video-ORA SFT for ms-swift.

`swift sft --custom_register_path swift_vora` imports this package inside ms-swift; that import registers
the `video_ora` template and dataset. Tools that do not need ms-swift (`swift-vora plan`, `doctor`,
`eval`) import submodules without paying for ms-swift's import; call `register()` yourself when you use
ms-swift's Python API directly.
"""
import sys

__version__ = '0.1.0'


def register():
    """Register the `video_ora` template and dataset with ms-swift (idempotent)."""
    from .swift_registry import register_all
    register_all()  # refuses a SWIFT_VORA_* name that is not a switch (swift_vora/switches.py) first


if 'swift' in sys.modules:  # imported by ms-swift's plugin loader (or after `import swift`)
    register()
