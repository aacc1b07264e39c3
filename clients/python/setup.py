"""Copies the Cap'n Proto schemas of protocol/ into the package when it is built from the
source tree (pip install ./clients/python), so the RPC transport finds them installed."""
import pathlib
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent
PROTOCOL = HERE.parent.parent / "protocol"


class with_schemas(build_py):
    def run(self):
        target = HERE / "tireless_client" / "schema"
        if PROTOCOL.is_dir():
            target.mkdir(exist_ok=True)
            for f in PROTOCOL.glob("*.capnp"):
                shutil.copyfile(f, target / f.name)
        super().run()


setup(cmdclass={"build_py": with_schemas})
