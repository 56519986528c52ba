"""The backends a plan can choose, each named once.

A `Backend` is a str: its value is the name recipes (`train.backend`), `swift-vora plan --backend` and the plan's
JSON use, so it compares, prints and serialises as that name. The planner decides which one trains a model
(rules.py, select.py) and predicts its memory (memory.py); swift_vora/backends/ has one launcher per backend.
"""
from __future__ import annotations

from enum import Enum


class Backend(str, Enum):
    DDP = 'ddp'  # plain swift sft: one process per GPU, each a full replica
    DEEPSPEED_ZERO2 = 'deepspeed_zero2'  # swift sft under DeepSpeed ZeRO-2
    DEEPSPEED_ZERO3 = 'deepspeed_zero3'  # swift sft under DeepSpeed ZeRO-3 (the dense default)
    MEGATRON_EP_LORA = 'megatron_ep_lora'  # megatron sft: expert-parallel LoRA for MoE on several GPUs
    MEGATRON_EP_FULL = 'megatron_ep_full'  # megatron sft: expert-parallel full SFT for MoE (distributed optimizer)
    UNSLOTH_SPLIT_LORA = 'unsloth_split_lora'  # Unsloth's split MoE LoRA on one GPU, through our runner

    def __str__(self) -> str:  # the name, in f-strings and str() alike (Python < 3.11 has no StrEnum)
        return self.value

    @property
    def deepspeed(self) -> bool:
        return self in DEEPSPEED


DEEPSPEED = (Backend.DEEPSPEED_ZERO2, Backend.DEEPSPEED_ZERO3)
AUTO = 'auto'  # not a backend: the planner's choice
