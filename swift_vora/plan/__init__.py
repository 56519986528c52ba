"""The planner: from config.json + hardware + recipe, which backend can train this and whether it fits.

    from swift_vora.plan import PlanRequest, make_plan
    plan = make_plan(PlanRequest(model='path/or/config.json', hardware='h200x1', tuner='lora'))
    plan.verdict, plan.backend, plan.gpu_peak_gib, plan.reasons, plan.exit_code, plan.spec

The plan decides; it builds no command (swift_vora/cli/compose.py gives it its launch's) and imports nothing of
swift_vora.backends. Pure Python: importing this package (or any module in it) does not import torch or
transformers, so `swift-vora plan` answers in well under a second. See docs/planner.md and docs/architecture.md.
"""
from .backend import Backend
from .hardware import PROFILES, Hardware
from .memory import BACKENDS, MemoryEstimate, TrainSetup, estimate
from .model_source import load_config, load_model_spec
from .model_spec import ModelSpec, UnsupportedModel, model_spec
from .request import Plan, PlanRequest
from .select import make_plan
from .video_budget import VideoTokens, frame_pair_tokens, smart_nframes, video_tokens

__all__ = [
    'BACKENDS', 'Backend', 'Hardware', 'MemoryEstimate', 'ModelSpec', 'PROFILES', 'Plan', 'PlanRequest', 'TrainSetup',
    'UnsupportedModel', 'VideoTokens', 'estimate', 'frame_pair_tokens', 'load_config', 'load_model_spec', 'make_plan',
    'model_spec', 'smart_nframes', 'video_tokens'
]
