"""Fixtures of the platform-backend tests (``fake_job`` comes from ``tests/conftest.py``)."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest


@pytest.fixture(scope="session")
def kit(wait_for: Callable[..., Any]) -> SimpleNamespace:
    """Helpers the backend tests share (``kit.wait_for``)."""
    return SimpleNamespace(wait_for=wait_for)
