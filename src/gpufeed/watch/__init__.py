"""Diagnose an unmodified training script from outside: ``gpufeed diagnose -- python train.py ...``.

The CLI runs the script with ``watch/site`` first on its ``PYTHONPATH``; that directory's ``sitecustomize`` installs
:mod:`gpufeed.watch.hook` in every process of the script, which times each ``next()`` of each ``DataLoader`` and
writes a :class:`~gpufeed.watch.record.ProcessRecord` at exit. The parent reads the records and reports
(``gpufeed.watch.run.watch(cmd, ...)`` does it all, for tests).
"""

from .record import LoaderRecord, ProcessRecord, read_records

__all__ = ["LoaderRecord", "ProcessRecord", "read_records"]
