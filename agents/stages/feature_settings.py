"""Settings of online feature enrichment (env prefix `TIDEGATE_FEATURES_`)."""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

from tidegate.core.settings import settings_config

__all__ = ["UPDATED_AT", "FeatureSettings", "InputFeatures"]

InputFeatures = dict[str, tuple[str, ...]]
"""One model version's declaration: input name -> the feature names its row holds, in order."""

UPDATED_AT = "_updated_at"


class FeatureSettings(BaseSettings):
    """Online features (env prefix `TIDEGATE_FEATURES_`). Off unless `declared` names a model."""

    model_config = settings_config("TIDEGATE_FEATURES_")

    declared: dict[str, InputFeatures] = Field(
        default_factory=dict,
        description='JSON: `{"fraud": {"features": ["amount", ...]}}`. Keys are a model or '
        "`model@version` (which wins over the model's); each maps an input to the features "
        "that make its one row, in order. A request with an `entity_key` gets each declared "
        "input it does not carry built from the entity's hash.",
    )
    key_prefix: str = Field(
        "tidegate:features:",
        min_length=1,
        description="An entity's hash is at `<key_prefix><entity_key>`.",
    )

    @field_validator("declared")
    @classmethod
    def _check(cls, value: dict[str, InputFeatures]) -> dict[str, InputFeatures]:
        for where, inputs in value.items():
            for name, features in inputs.items():
                if not features:
                    raise ValueError(f"{where}: input {name!r} declares no feature")
                if len(set(features)) != len(features):
                    raise ValueError(f"{where}: input {name!r} names a feature twice")
                if UPDATED_AT in features:
                    raise ValueError(f"{where}: {UPDATED_AT} is the hash's timestamp field")
        return value

    def inputs(self, model: str, version: str) -> InputFeatures | None:
        """The declaration that applies to `model` `version`, if any."""
        return self.declared.get(f"{model}@{version}") or self.declared.get(model)

    def models(self) -> frozenset[str]:
        return frozenset(key.split("@", 1)[0] for key in self.declared)
