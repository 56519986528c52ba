"""Evaluation: read model answers back, score them, report.

- `metrics`: QVHighlights moment retrieval / highlight detection (the official evaluator's figures)
  and kept-seconds precision / recall / F1 / IoU.
- `evaluate`: annotation and prediction files -> per-video windows -> metrics (row format in its
  docstring and docs/eval.md).
- `report`: metrics.json, report.md and PNG timelines for `--out-dir`.
- `baselines`: reference predictions (oracle, shifted, whole video, random) for checking a pipeline.
- `cli`: `swift-vora eval` and `swift-vora parse`.

Answers are parsed by `swift_vora.answer_parser.parse_answer`. Running a model over a dataset belongs in
a separate module (inference), not here.
"""
