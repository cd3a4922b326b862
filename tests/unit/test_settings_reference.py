"""docs/reference/settings.md is what infra/settings_reference.py prints from the settings
classes: a field added, renamed or redescribed without `make docs` fails here."""

from __future__ import annotations

from pathlib import Path

from tests.support import settings_reference

REPO = Path(__file__).resolve().parents[2]


def test_the_settings_reference_is_current() -> None:
    page = REPO / "docs" / "reference" / "settings.md"
    assert page.read_text() == settings_reference().render(), "run `make docs`"


def test_every_field_of_every_settings_class_is_listed() -> None:
    from tidegate.core.settings import KafkaSettings
    from tidegate.gateway.auth.auth_settings import AuthSettings

    made = settings_reference()
    text = made.render()
    classes = made.settings_classes()
    assert KafkaSettings in classes
    assert AuthSettings in classes
    for cls in classes:
        prefix = cls.model_config["env_prefix"]
        for name in cls.model_fields:
            assert f"| `{prefix}{name.upper()}` |" in text, f"{cls.__qualname__}.{name}"
    # A secret's value never appears, even a default one.
    assert "change-me" not in text
