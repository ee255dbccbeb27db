"""Shared fixtures: the chips most tests run on."""

from __future__ import annotations

import pytest

import hwdesc


@pytest.fixture(scope="session")
def mncore2() -> hwdesc.HwDesc:
    return hwdesc.load("mncore2")


@pytest.fixture(scope="session")
def mini() -> hwdesc.HwDesc:
    return hwdesc.load("mini")
