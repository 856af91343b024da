"""Package discovery for the single ``agentgym`` namespace.

The top-level folders ``envs/``, ``policies/``, ``trainers/`` and ``recipes/`` install as ``agentgym.envs``,
``agentgym.policies``, ``agentgym.trainers`` and ``agentgym.recipes``. Subpackages are discovered, so adding
an env family needs no edit here. All metadata lives in pyproject.toml.

``recipes/`` is mapped like the others (rather than shipped as a top-level ``recipes`` package or left out
of the install): ``agentgym train`` imports the recipes from an installed package, nothing new lands at
the top level of site-packages, and an editable install serves the repository's files.
"""

from setuptools import find_packages, setup

MAPPED = {"agentgym": "agentgym", "agentgym.envs": "envs", "agentgym.policies": "policies", "agentgym.trainers": "trainers",
          "agentgym.recipes": "recipes"}

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
