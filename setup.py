"""What pyproject.toml cannot say: the configs at the top-level ``conf/`` ship as ``grab_exp.conf``.

Everything else about the package is in ``pyproject.toml``. A ``packages.find`` table there sees
only folders under their own package name, so the package list and the one folder mapped to
another name are given here.
"""

from setuptools import find_namespace_packages, setup

setup(
    # hydra_plugins: the sweeper and launcher (Hydra finds plugins there only)
    packages=[*find_namespace_packages(include=["grab_exp*", "hydra_plugins*"]), "grab_exp.conf"],
    package_dir={"grab_exp.conf": "conf"},  # read as pkg://grab_exp.conf, installed or editable
)
