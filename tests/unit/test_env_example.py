"""`.env.example` documents every setting, and its values are accepted by the settings."""
from pathlib import Path

from core.settings import Settings, load_settings

ENV_EXAMPLE = Path(__file__).resolve().parents[2] / ".env.example"


def _entries() -> dict[str, str]:
    entries = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line.startswith("MINISERVE_"):
            name, _, value = line.partition("=")
            entries[name] = value.split("#", 1)[0].strip()
    return entries


def test_every_setting_is_documented():
    documented = set(_entries())
    expected = {f"MINISERVE_{name.upper()}" for name in Settings.model_fields}
    assert expected - documented == set(), "settings missing from .env.example"
    assert documented - expected == set(), ".env.example names unknown settings"


def test_documented_values_are_valid():
    values = {k.removeprefix("MINISERVE_").lower(): v for k, v in _entries().items()
              if v and k != "MINISERVE_CACHE_DIR"}
    load_settings(**values)
