"""Process-wide CPU settings the hardware profile makes: glibc keeps freed tensor memory; a compiled
run on a CPU without a C++ compiler is refused at start."""

from __future__ import annotations

import ctypes.util
import sys
import sysconfig

import pytest
import torch._inductor.config

from lehr.engine import hardware
from lehr.engine.run.loop import train

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


def test_compiling_on_a_cpu_without_a_cxx_compiler_is_refused_at_start(tiny_config, tmp_path, monkeypatch):
    # where inductor looks for g++ (the CXX environment variable when torch was imported)
    monkeypatch.setattr(torch._inductor.config.cpp, "cxx", (None, str(tmp_path / "no-such-g++")))
    refusal = r"no C\+\+ compiler was found .*no-such-g\+\+.*or set compile: false"
    with pytest.raises(ValueError, match=refusal):
        train(tiny_config(compile=True))
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_compiling_on_a_cpu_without_pythons_headers_is_refused_at_start(tiny_config, tmp_path, monkeypatch):
    # a Python installed without its development headers (Debian's python3 without python3-dev)
    paths = sysconfig.get_paths()
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {**paths, "include": str(tmp_path / "include")})
    with pytest.raises(ValueError, match=r"against Python's headers, and .*include/Python.h is missing"):
        train(tiny_config(compile=True))
    assert not (tmp_path / "run").exists()
