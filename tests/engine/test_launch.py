"""The launcher's guarantee that a kill leaves no process behind: a process started with
``die_with_parent`` is killed by the kernel when its parent dies, however the parent dies."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

PARENT = """
import subprocess, sys
from lehr.engine.processes.launch import die_with_parent
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], preexec_fn=die_with_parent)
print(child.pid, flush=True)
child.wait()
"""


def test_a_child_started_to_die_with_its_parent_dies_when_the_parent_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    child = psutil.Process(int(parent.stdout.readline()))
    assert child.is_running()
    parent.kill()  # SIGKILL: no handler, no cleanup runs in the parent
    parent.wait()
    deadline = time.time() + 30  # the child would otherwise sleep for 10 minutes
    while time.time() < deadline:
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    else:
        child.kill()
        raise AssertionError("the child outlived its killed parent")
