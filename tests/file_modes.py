"""Child processes that file modes apply to, for tests of unreadable and
unwritable paths. Root passes every mode check through two capabilities
(CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), so as root the child runs without
them: still root, the owner of the test's files, but held to their modes."""

import os
import shutil
import sys

import pytest


def python_command() -> list[str]:
    """The command line that starts this Python with file modes enforced."""
    if os.geteuid() != 0:
        return [sys.executable]
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv (util-linux), which can drop the capabilities "
                    "that bypass file modes")
    return [setpriv, "--bounding-set", "-dac_override,-dac_read_search", "--", sys.executable]
