"""Process-wide CPU settings the hardware profile makes: glibc keeps freed tensor memory."""

from __future__ import annotations

import ctypes.util
import sys

import pytest

from lehr.engine import hardware

glibc = pytest.mark.skipif(
    not sys.platform.startswith("linux") or "libc.so" not in (ctypes.util.find_library("c") or ""),
    reason="mallopt is glibc's",
)


@glibc
def test_glibc_takes_every_heap_setting():
    assert hardware.keep_heap_memory()


@glibc
def test_a_cpu_profile_keeps_heap_memory(monkeypatch):
    calls = []
    monkeypatch.setattr(hardware, "keep_heap_memory", lambda: calls.append(1) or True)
    assert hardware.resolve("cpu", "fp32", None).device.type == "cpu" and calls == [1]
