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


def test_the_control_file_alone_leaves_the_registry_unimported_until_asked_for() -> None:
    # The trainer imports only the control file; the registry builds every kind's models.
    code = (
        "import sys, stormwatch.faults.control_file\n"
        "print('stormwatch.faults.registry' in sys.modules)\n"
        "import stormwatch.faults as faults\n"
        "print(len(faults.REGISTRY) > 0, faults.parse_request.__module__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == ["False", "True", "stormwatch.faults.registry"], out.stderr


def test_the_lazily_imported_names_are_exactly_the_registrys() -> None:
    """``stormwatch.faults`` lists the registry's names to import them on first use: the
    list and the registry's ``__all__`` must not drift apart."""
    import stormwatch.faults as faults
    from stormwatch.faults import registry

    assert frozenset(registry.__all__) == faults._REGISTRY_NAMES
