"""What every swift-vora callback inside `megatron sft` holds, as Megatron-SWIFT's own `MegatronCallback`
(swift/megatron/callbacks/base.py) does: the trainer, its arguments and its state.

Kept here, importing nothing, so that the callbacks (the data-loader prefetch, the step profile, the coalesced
optimizer, the guards) need no ms-swift import and are tested on a CPU; swift_registry.py mixes Megatron-SWIFT's
class in when it registers them, for the events a callback does not handle.
"""
from __future__ import annotations


class MegatronTrainerCallback:
    def __init__(self, trainer):
        self.trainer = trainer
        self.args = trainer.args
        self.state = trainer.state
