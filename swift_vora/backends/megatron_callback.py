"""What every swift-vora callback inside `megatron sft` holds, as Megatron-SWIFT's own `MegatronCallback`
(swift/megatron/callbacks/base.py) does: the trainer, its arguments and its state, and a no-op for each event
Megatron-SWIFT calls (a callback overrides the ones it handles).

Kept here, importing nothing, so that the callbacks (the data-loader prefetch, the step profile, the coalesced
optimizer, the guards) need no ms-swift import and are tested on a CPU; swift_registry.py mixes Megatron-SWIFT's
class in when it registers them, for events a later ms-swift adds.
"""
from __future__ import annotations


class MegatronTrainerCallback:
    def __init__(self, trainer):
        self.trainer = trainer
        self.args = trainer.args
        self.state = trainer.state

    def on_train_begin(self):
        pass

    def on_train_end(self):
        pass

    def on_step_begin(self):
        pass

    def on_step_end(self):
        pass

    def on_log(self, logs):
        pass

    def on_eval_begin(self):
        pass

    def on_eval_end(self):
        pass

    def on_eval_step(self):
        pass

    def on_save(self, output_dir):
        pass
