"""The optional-package guard: a skip normally, a failure under TRAINPORT_CI_NO_SKIP=1."""

from __future__ import annotations

from collections.abc import Callable

import pytest


def test_missing_package_skips(
    require: Callable[..., object], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRAINPORT_CI_NO_SKIP", raising=False)
    with pytest.raises(pytest.skip.Exception, match="not installed"):
        require("trainport_no_such_package")


def test_missing_package_fails_in_ci(
    require: Callable[..., object], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINPORT_CI_NO_SKIP", "1")
    with pytest.raises(pytest.fail.Exception, match="TRAINPORT_CI_NO_SKIP=1"):
        require("trainport_no_such_package")


def test_present_package_is_returned(require: Callable[..., object]) -> None:
    assert require("json").__name__ == "json"
