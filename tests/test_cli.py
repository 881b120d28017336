import subprocess
import sys

import gpufeed
from gpufeed.cli.main import main


def test_version_is_printed_by_the_console_entry_point():
    out = subprocess.run([sys.executable, "-m", "gpufeed", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"gpufeed {gpufeed.__version__}"


def test_no_command_prints_help_and_succeeds(capsys):
    assert main([]) == 0
    assert "usage: gpufeed" in capsys.readouterr().out
