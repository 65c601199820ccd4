"""Map each top-level code folder onto ``stormwatch.<folder>``.

pyproject.toml holds the metadata; only the package mapping lives here because
setuptools cannot compute ``package-dir`` for nested sub-packages declaratively.
"""

from setuptools import find_packages, setup

COMPONENTS = (
    "faults",
    "postmortem",
    "telemetry",
    "agent",
    "trainer",
    "chaos",
    "alerts",
    "dashboards",
    "lab",
    "plan",
)

packages = ["stormwatch", *(f"stormwatch.{p}" for p in find_packages("stormwatch"))]
package_dir = {"stormwatch": "stormwatch"}
for component in COMPONENTS:
    packages.append(f"stormwatch.{component}")
    packages.extend(f"stormwatch.{component}.{p}" for p in find_packages(component))
    package_dir[f"stormwatch.{component}"] = component

setup(packages=packages, package_dir=package_dir)
