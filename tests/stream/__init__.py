"""Tests of gpufeed.mds and gf.stream (a package: its test_plan.py would otherwise clash with tests/test_plan.py)."""
