"""Helpers for the tests: real servers started as subprocesses."""
