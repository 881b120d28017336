"""gpufeed.watch.diff: a report's change applied to a script's text, and the diff that ``patch -p1`` applies."""

import textwrap

import pytest

from gpufeed.watch.advice import Change
from gpufeed.watch.diff import file_change


def test_the_file_change_keeps_line_numbers_adds_the_import_once_and_its_diff_applies_with_patch(tmp_path):
    import subprocess

    text = textwrap.dedent(
        '''\
        """A training script."""
        from __future__ import annotations

        import torch
        from torch.utils.data import DataLoader


        def main(ds):
            loader = DataLoader(ds,
                                batch_size=8,
                                num_workers=2)
            return loader  # line 12
        '''
    )
    change = Change("DataLoader(ds,\n                        batch_size=8,\n                        num_workers=2)",
                    "gf.accelerate(ds, batch_size=8, shuffle=False)")  # fmt: skip
    new, diff = file_change(text, 9, change, "train.py")
    lines = new.splitlines()
    assert lines[3] == "import gpufeed as gf" and lines[4] == "import torch"  # after __future__, before the imports
    assert lines[9] == "    loader = gf.accelerate(ds, batch_size=8, shuffle=False)"
    assert lines[12] == "    return loader  # line 12" and len(lines) == len(text.splitlines()) + 1
    assert (
        file_change(new, 10, Change("gf.accelerate(ds, batch_size=8, shuffle=False)", "x()"))[0].count(
            "import gpufeed as gf"
        )
        == 1
    )
    (tmp_path / "train.py").write_text(text)
    (tmp_path / "fix.diff").write_text(diff)
    subprocess.run(["patch", "-p1", "-i", "fix.diff"], cwd=tmp_path, check=True, capture_output=True)
    assert (tmp_path / "train.py").read_text() == new
    with pytest.raises(ValueError, match="is not at line 3"):
        file_change(text, 3, change)
