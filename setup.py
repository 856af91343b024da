"""Package discovery for the single ``agentgym`` namespace.

The top-level folders ``envs/``, ``policies/`` and ``trainers/`` install as ``agentgym.envs``,
``agentgym.policies`` and ``agentgym.trainers``. Subpackages are discovered, so adding an env
family needs no edit here. All metadata lives in pyproject.toml.
"""

from setuptools import find_packages, setup

MAPPED = {"agentgym": "agentgym", "agentgym.envs": "envs", "agentgym.policies": "policies", "agentgym.trainers": "trainers"}

packages: list[str] = []
for namespace, folder in MAPPED.items():
    packages.append(namespace)
    packages += [f"{namespace}.{sub}" for sub in find_packages(folder)]

setup(
    packages=packages,
    package_dir=MAPPED,
    package_data={"": ["py.typed", "*.json", "*.jsonl", "*.jsonl.gz", "*.gz", "*.txt", "*.tsv", "*.pddl", "*.twl2"],
                  "agentgym.view.static": ["*.html", "*.js", "*.css"]},
    include_package_data=True,
)
