"""`swift-vora predict`: new, unlabelled videos through a trained checkpoint, one JSON line per video.

- `videos`: the videos named on the command line (files, folders searched recursively), their ids, and a probe of
  each (duration; an unreadable file is reported by name, never sent to the model).
- `lines`: the prediction line (docs/contract.md): built from a video's answered clips, checked when read back
  (by `predict` to resume, by `swift-vora cut` to edit).
- `run`: the videos as an annotation file without answers through eval's inference path (swift_vora/eval/
  inference.py: the checkpoint's windows, budget and prompt, ms-swift's engine), each video's line written as soon
  as all its clips are answered.
- `cli`: the command.
"""
