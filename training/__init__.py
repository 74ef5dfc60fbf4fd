"""Builders of the shipped weights: the semantic cache's verifier, the learned router, the cascade confidence.

Not part of what ships (the wheel packages none of it): each builder reads its data and writes the artifact the
product loads. They may import bench/'s data helpers; nothing in the product or bench/ imports them
(import-linter contract `nothing-imports-training`). training/README.md: one command per artifact, and how
a rebuilt artifact is checked against the shipped one (`python -m training.check`).
"""
