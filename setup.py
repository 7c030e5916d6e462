"""Maps the repository's folders onto the one import name `stitchcuda` (docs/adr/0001-layout.md)."""

from setuptools import find_namespace_packages, setup

ROOTS = {
    "stitchcuda": "services",
    "stitchcuda.shared": "shared",
    "stitchcuda.api": "proto/stitchcuda/api",
    "stitchcuda.training": "training",
}

packages: list[str] = []
package_dir: dict[str, str] = {}
for name, path in ROOTS.items():
    package_dir[name] = path
    packages.append(name)
    # Namespace discovery: a folder without __init__.py (coder/synth, shared/templates) is still a
    # package of the wheel; caches and build outputs are not.
    found = find_namespace_packages(path, exclude=["*__pycache__*", "build*", "*.egg-info*"])
    packages.extend(f"{name}.{sub}" for sub in found)

DATA = [
    "py.typed",
    "*.proto",
    "*.j2",
    "*.md",
    "*.txt",
    "*.json",
    "*.yaml",
    "*.cu",
    "*.cuh",
    "*.cpp",
    "*.h",
    "*.html",
]

setup(packages=packages, package_dir=package_dir, package_data=dict.fromkeys(packages, DATA))
