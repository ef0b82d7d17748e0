"""Benchmarks behind ``robot-wm bench``: numbers printed, never pass/fail (issue #13)."""
