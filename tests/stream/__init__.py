"""Tests of gpufeed.stream (a package: its test_plan.py would otherwise clash with tests/test_plan.py)."""
