"""Hypothesis profiles for the decoder fuzzing: ``bounded`` (the default, in every test run) and
``fuzz`` (``tox -e fuzz``: many more inputs per decoder)."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile(
    "bounded", max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile(
    "fuzz", max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.load_profile("bounded")
