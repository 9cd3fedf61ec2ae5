"""The test and diagnostic modules, which CMakeLists.txt builds only with JAXRING_BUILD_TESTING (make test's
install turns it on): a test that needs one fails saying how to build it, never skips."""

import importlib

BUILD_WITH_THEM = ("build jaxring with its test modules: `make .venv/.installed`, or `pip install --no-build-isolation "
                   "--config-settings=cmake.define.JAXRING_BUILD_TESTING=ON -e .`")


def built_test_module(name: str):
    """The module `name` (jaxring.collectives._jaxring_protocol, ...), or an ImportError that says how to build it."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name != name:
            raise
        raise ImportError(f"{name} is not built: {BUILD_WITH_THEM}") from None
