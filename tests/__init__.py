"""The test suite: a package, so `support` means the top-level helpers and not tests/support."""
