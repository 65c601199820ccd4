"""stormwatch.faults is a shared package: it imports no component package and not torch."""

from __future__ import annotations

import subprocess
import sys

COMPONENTS = ("agent", "trainer", "chaos", "alerts", "lab", "plan", "dashboards")


def test_importing_faults_imports_no_component_package_and_not_torch() -> None:
    code = (
        "import sys, stormwatch.faults, stormwatch.faults.control_file\n"
        f"bad = [m for m in sys.modules if m.split('.')[:2] in "
        f"[['stormwatch', c] for c in {COMPONENTS!r}]]\n"
        "print(sorted(bad), 'torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[] False", out.stdout + out.stderr
