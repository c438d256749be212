"""The wheel carries pdinfra's Ansible content: build_py assembles the collection pdinfra.pd and an ansible.cfg into
pdinfra/_ansible (pdinfra.collection.bundle), so that an installed pdinfra runs its playbooks without a checkout.
Everything else is in pyproject.toml."""

import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class BuildPyWithAnsible(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode or not (HERE / "site.yml").is_file():
            return  # an editable install runs from the checkout; an sdist without the Ansible tree has nothing to add
        sys.path.insert(0, str(HERE))
        from pdinfra.collection import bundle

        bundle(HERE, Path(self.build_lib) / "pdinfra" / "_ansible")


setup(cmdclass={"build_py": BuildPyWithAnsible})
