"""The dashboard's fixtures."""

from __future__ import annotations

import pytest

from cwviz.app import services


@pytest.fixture
def count_forward_passes(monkeypatch):
    """The forward passes the services run (a list that grows by one a pass)."""
    calls = []
    real = services.analyze

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(services, "analyze", counted)
    return calls
