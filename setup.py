"""Ship the repository's recipes/ folder inside the package, as ``rlhfctl/recipes_bundled/``: the recipes and
recipe.schema.json, the JSON Schema their first lines point editors at.

The metadata is in pyproject.toml. Only the package list lives here: pyproject.toml cannot map a
folder outside the package (recipes/, where a checkout keeps them) to a package path.
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["rlhfctl*", "workers*"]), "rlhfctl.recipes_bundled"],
    package_dir={"rlhfctl.recipes_bundled": "recipes"},
    package_data={"rlhfctl.recipes_bundled": ["*.yaml", "recipe.schema.json"]},
)
