"""The leftover check (``tests/leftovers.py``, issue 21): a session whose tests leave a
process or a network namespace behind fails and names the test; each session judges only
what it started."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import psutil
import pytest

PLUGIN = Path(__file__).with_name("leftovers.py")

CONFTEST = textwrap.dedent(
    f"""
    import importlib.util, sys
    spec = importlib.util.spec_from_file_location("leftovers_under_test", {str(PLUGIN)!r})
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)

    def pytest_configure(config):
        config.pluginmanager.register(module.Leftovers(), "leftovers-under-test")
    """
)


def _session(tmp_path: Path, tests: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(tests))
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    root: needs root\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STORMWATCH_TEST_")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
        check=False,
    )


def _running(marker: str) -> list[int]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if marker in " ".join(proc.info["cmdline"] or ()) and proc.status() != "zombie":
            found.append(proc.pid)
    return found


def test_an_orphaned_process_fails_the_session_names_its_test_and_is_stopped(
    tmp_path: Path,
) -> None:
    marker = f"leftover-{uuid.uuid4().hex}"
    done = _session(
        tmp_path,
        f"""
        import subprocess, sys

        def test_clean():
            subprocess.run([sys.executable, "-c", "pass"], check=True)

        def test_leaks():  # a new session: reparented to init once this test's pytest exits
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "{marker}"],
                             start_new_session=True)
        """,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "2 passed" in done.stdout
    leftovers = done.stdout.split("= leftovers =")[1]
    assert "started by test_inner.py::test_leaks" in leftovers, done.stdout
    assert "test_clean" not in leftovers
    assert _running(marker) == []  # reported, then stopped


def test_a_session_that_cleans_up_passes_and_ignores_other_sessions_processes(
    tmp_path: Path,
) -> None:
    marker = f"other-{uuid.uuid4().hex}"
    # Another session's process, running all along (what `make test`'s other tier starts).
    other = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)", marker],
        env={**os.environ, "STORMWATCH_TEST_SESSION": "another-session"},
    )
    try:
        done = _session(
            tmp_path,
            """
            import subprocess, sys

            def test_waits_for_its_child():
                child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
                child.wait()
            """,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "leftovers" not in done.stdout
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_the_sessions_own_forkserver_is_not_a_leftover_but_what_it_forked_is(
    tmp_path: Path,
) -> None:
    """multiprocessing's forkserver and resource tracker serve the pytest process and end
    with it; a process the forkserver started and nobody stopped is a leftover."""
    done = _session(
        tmp_path,
        """
        import multiprocessing, time

        def sleep(seconds):
            time.sleep(seconds)

        def test_uses_a_forkserver():
            process = multiprocessing.get_context("forkserver").Process(target=sleep, args=(0.1,))
            process.start()
            process.join()

        def test_leaks_a_forked_process():
            multiprocessing.get_context("forkserver").Process(target=sleep, args=(600,)).start()
        """,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    leftovers = done.stdout.split("= leftovers =")[1]
    # One: the forked process (its command line is the forkserver's, and so is its
    # environment: it is named by the test that started the forkserver). Not the forkserver
    # or the resource tracker.
    assert "1 thing(s)" in leftovers and "resource_tracker" not in leftovers, leftovers


@pytest.mark.root
def test_a_network_namespace_left_behind_fails_the_session(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and ip(8): makes a network namespace")
    name = f"swleft{uuid.uuid4().hex[:8]}"
    try:
        done = _session(
            tmp_path,
            f"""
            import subprocess

            import pytest

            @pytest.mark.root  # a test that may make kernel objects: listed around it
            def test_makes_a_namespace():
                subprocess.run(["ip", "netns", "add", "{name}"], check=True)
            """,
        )
        assert done.returncode == 1, done.stdout + done.stderr
        assert f"network namespace {name} made during test_inner.py::test_makes_a_namespace" in (
            done.stdout
        )
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False, capture_output=True)


def test_iproute2s_own_netns_mount_is_the_machines_but_a_namespace_under_it_is_a_leftover(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # On a fresh machine (CI) the first `ip netns add` bind-mounts /run/netns onto itself for
    # good: the test that happened to add the first namespace is not to blame for that mount.
    spec = importlib.util.spec_from_file_location("leftovers_mounts_under_test", PLUGIN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look themselves up
    spec.loader.exec_module(module)
    mountinfo = textwrap.dedent(
        """\
        25 30 0:23 / /run rw,nosuid,nodev shared:5 - tmpfs tmpfs rw,mode=755
        610 25 0:23 /netns /run/netns rw,nosuid,nodev shared:5 - tmpfs tmpfs rw,mode=755
        650 610 0:4 net:[4026532290] /run/netns/swlab-node0 rw shared:5 - nsfs nsfs rw
        """
    )
    assert module.mount_points(mountinfo) == {"/run", "/run/netns/swlab-node0"}
