"""Hostile and broken inputs, each built here, a module per command (``harness.py`` holds what they share):
every one is refused with exit 2 and one error line naming it (or, where it is fine, handled exactly), with
no traceback, no file of the user's changed and nothing left behind; those that used to exhaust the machine
or hang run in a child process under a time limit and a peak-memory bound.

docs/safety.md's "Hostile inputs" line reports ``test_counts.counts()``; a test keeps the two equal. A crash, hang,
silent result or lost file fails its test, so the counts of those are zero whenever this folder passes.
"""
