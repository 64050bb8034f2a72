"""Package discovery for gpufeed's layout; all metadata lives in pyproject.toml.

The top-level folders are the architecture, and each installs under the one ``gpufeed``
namespace: ``gpufeed/`` as ``gpufeed``, ``pipelines/`` as ``gpufeed.pipelines``, ``models/`` as
``gpufeed.models``, ``server/`` as ``gpufeed.server``. pyproject's declarative ``packages.find``
cannot put a prefix on what it finds, and a hand-written package list goes stale the day someone
adds a subpackage, so every package under each root is found here, at build time.
"""

from setuptools import find_namespace_packages, setup

# Installed name -> the folder it is built from.
ROOTS = {
    "gpufeed": "gpufeed",
    "gpufeed.pipelines": "pipelines",
    "gpufeed.models": "models",
    "gpufeed.server": "server",
}
# Every folder under a root counts (namespace discovery: a package-data folder such as
# gpufeed/obs/stack is one too), except bytecode caches.
_NOT_PACKAGES = ["__pycache__", "*.__pycache__"]


def discover_packages() -> list[str]:
    """Every package (and package-data folder) under each root, named with its ``gpufeed.*`` prefix."""
    packages = []
    for name, folder in ROOTS.items():
        found = find_namespace_packages(folder, exclude=_NOT_PACKAGES)
        # e.g. a gpufeed/server/ folder would be installed over the server/ root.
        clash = sorted(f"{name}.{sub}" for sub in found if f"{name}.{sub}" in ROOTS)
        if clash:
            raise SystemExit(f"{folder}/ holds folders named like other installed roots: {', '.join(clash)}")
        packages += [name, *(f"{name}.{sub}" for sub in found)]
    return packages


setup(packages=discover_packages(), package_dir=ROOTS)
